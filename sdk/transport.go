package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// request is one call to the server or a sandbox.
type request struct {
	op     string // what the call does, for errors
	method string
	url    string
	header http.Header // added to the target's headers

	body        []byte    // a body that can be sent again
	stream      io.Reader // a body that cannot; such a call is never retried
	contentType string

	// idempotent allows retries after transient failures.
	idempotent bool
	// streaming says the answer's body is read for as long as it lasts:
	// the request timeout then bounds only the wait for the headers.
	streaming bool
	// ok lists the statuses that are success; default any 2xx.
	ok []int
}

// transport sends requests for a Client and the sandboxes it hands out.
type transport struct {
	hc        *http.Client
	timeout   time.Duration // per call; <= 0 means none
	retries   int
	userAgent string
}

// jsonRequest is a request carrying v as its JSON body.
func jsonRequest(op, method, url string, v any) (*request, error) {
	r := &request{op: op, method: method, url: url}
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("%s: encode request: %w", op, err)
		}
		r.body, r.contentType = b, "application/json"
	}
	return r, nil
}

// do sends r, retrying an idempotent request after transient failures,
// and returns a successful answer whose body the caller must close. An
// error answer becomes an *APIError.
func (t *transport) do(ctx context.Context, r *request) (*http.Response, error) {
	attempts := 1
	if r.idempotent && r.stream == nil && t.retries > 0 {
		attempts += t.retries
	}
	for i := 0; ; i++ {
		resp, err := t.once(ctx, r)
		last := i+1 >= attempts
		switch {
		case err != nil:
			// A request that took its whole timeout is not tried again:
			// RequestTimeout bounds the call, not each attempt.
			if last || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
				return nil, err
			}
		case retryable(resp.StatusCode) && !last:
			io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
			resp.Body.Close()
			if wait := retryAfter(resp); wait > 0 {
				if err := sleep(ctx, wait); err != nil {
					return nil, fmt.Errorf("%s: %w", r.op, err)
				}
				continue
			}
		case !r.success(resp.StatusCode):
			defer resp.Body.Close()
			return nil, errorFrom(r.op, resp)
		default:
			return resp, nil
		}
		if err := sleep(ctx, backoff(i)); err != nil {
			return nil, fmt.Errorf("%s: %w", r.op, err)
		}
	}
}

func (r *request) success(status int) bool {
	if len(r.ok) == 0 {
		return status >= 200 && status < 300
	}
	for _, s := range r.ok {
		if s == status {
			return true
		}
	}
	return false
}

// once sends r one time. The answer's body, when there is one, is bound
// to the request timeout (or, for a streaming request, only its headers
// are) and releases the timeout's resources when closed.
func (t *transport) once(parent context.Context, r *request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(parent)
	var timer *time.Timer
	var timedOut error
	if t.timeout > 0 && r.stream == nil {
		timedOut = fmt.Errorf("request timed out after %v: %w", t.timeout, context.DeadlineExceeded)
		timer = time.AfterFunc(t.timeout, func() { cancel(timedOut) })
	}
	var body io.Reader
	switch {
	case r.stream != nil:
		body = r.stream
	case r.body != nil:
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, r.url, body)
	if err != nil {
		cancel(nil)
		return nil, fmt.Errorf("%s: %w", r.op, err)
	}
	for k, vs := range r.header {
		req.Header[k] = vs
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	req.Header.Set("User-Agent", t.userAgent)
	resp, err := t.hc.Do(req)
	if err == nil && r.streaming && timer != nil && !timer.Stop() {
		resp.Body.Close() // the timer fired as the headers arrived
		err = timedOut
	}
	if err != nil {
		cancel(nil)
		if timedOut != nil && context.Cause(ctx) == timedOut {
			return nil, fmt.Errorf("%s: %w", r.op, timedOut)
		}
		var ue *url.Error
		if errors.As(err, &ue) && parent.Err() == nil {
			return nil, &NetworkError{Op: r.op, URL: redact(r.url), Err: ue.Err}
		}
		return nil, fmt.Errorf("%s: %w", r.op, err)
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, ctx: ctx, cancel: cancel, timer: timer, timedOut: timedOut}
	return resp, nil
}

// NetworkError is a call that got no answer: the server or sandbox could
// not be reached, or the connection broke. It matches ErrUnavailable.
type NetworkError struct {
	Op  string
	URL string // scheme://host[:port]/path, without the query
	Err error
}

func (e *NetworkError) Error() string {
	return fmt.Sprintf("%s: cannot reach %s: %v", e.Op, e.URL, e.Err)
}

func (e *NetworkError) Unwrap() error { return e.Err }

// Is makes a NetworkError match ErrUnavailable.
func (e *NetworkError) Is(target error) bool { return target == ErrUnavailable }

// redact drops the query of a URL for messages.
func redact(raw string) string {
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		return raw[:i]
	}
	return raw
}

// cancelBody releases a request's context and timer when the body is
// closed, and reports a read cut by the request timeout as a timeout.
type cancelBody struct {
	io.ReadCloser
	ctx      context.Context
	cancel   context.CancelCauseFunc
	timer    *time.Timer
	timedOut error
}

func (b *cancelBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && b.timedOut != nil && context.Cause(b.ctx) == b.timedOut {
		err = b.timedOut
	}
	return n, err
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	if b.timer != nil {
		b.timer.Stop()
	}
	b.cancel(nil)
	return err
}

// retryable statuses are worth another try of an idempotent request.
func retryable(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// retryAfter is the server's Retry-After in seconds, up to 10 s; 0 when
// absent or unusable.
func retryAfter(resp *http.Response) time.Duration {
	s, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || s <= 0 {
		return 0
	}
	return min(time.Duration(s)*time.Second, 10*time.Second)
}

// backoff is the wait before retry i+1: 100 ms doubling up to 2 s, with
// jitter so that clients failing together do not retry together.
func backoff(i int) time.Duration {
	d := min(100*time.Millisecond<<i, 2*time.Second)
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// call sends r and decodes a JSON answer into out (which may be nil, and
// then the body is discarded).
func (t *transport) call(ctx context.Context, r *request, out any) error {
	resp, err := t.do(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s: decode answer: %w", r.op, err)
	}
	return nil
}

// target is a base URL and the headers every request to it must carry:
// the server with its API key, or a sandbox endpoint with its token.
type target struct {
	base   string // scheme://host[:port][/prefix], no trailing slash
	header http.Header
}

// url joins the base, a path and a query.
func (tg *target) url(path string, q url.Values) string {
	u := tg.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// req builds a request to path under the target with its headers.
func (tg *target) req(op, method, path string, q url.Values) *request {
	return &request{op: op, method: method, url: tg.url(path, q), header: tg.header.Clone()}
}

// jsonReq is req with v as a JSON body.
func (tg *target) jsonReq(op, method, path string, q url.Values, v any) (*request, error) {
	r, err := jsonRequest(op, method, tg.url(path, q), v)
	if err != nil {
		return nil, err
	}
	r.header = tg.header.Clone()
	return r, nil
}
