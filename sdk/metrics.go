package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"

	"github.com/opensandbox/opensandbox/api"
)

// Metrics returns the sandbox's current CPU and memory use, measured in
// its own cgroup.
func (s *Sandbox) Metrics(ctx context.Context) (*api.Metrics, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r := tg.req("get metrics of sandbox "+s.ID, http.MethodGet, "/metrics", nil)
	r.idempotent = true
	var out api.Metrics
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// MetricsError is a sample of WatchMetrics that the sandbox could not
// take; the watch goes on.
type MetricsError struct{ Message string }

func (e *MetricsError) Error() string { return "metrics sample: " + e.Message }

// WatchMetrics yields a sample about every second until ctx ends or the
// loop stops. A sample the sandbox could not take is yielded as a
// *MetricsError and the watch goes on; any other error ends it.
func (s *Sandbox) WatchMetrics(ctx context.Context) iter.Seq2[api.Metrics, error] {
	return func(yield func(api.Metrics, error) bool) {
		tg, err := s.execd(ctx)
		if err != nil {
			yield(api.Metrics{}, err)
			return
		}
		r := tg.req("watch metrics of sandbox "+s.ID, http.MethodGet, "/metrics/watch", nil)
		r.streaming = true
		r.header.Set("Accept", "text/event-stream")
		resp, err := s.c.t.do(ctx, r)
		if err != nil {
			yield(api.Metrics{}, err)
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 4096), 1<<20)
		for sc.Scan() {
			line := bytes.TrimSpace(sc.Bytes())
			line = bytes.TrimSpace(bytes.TrimPrefix(line, []byte("data:")))
			if len(line) == 0 || line[0] != '{' {
				continue
			}
			var sample struct {
				api.Metrics
				Error string `json:"error"`
			}
			if err := json.Unmarshal(line, &sample); err != nil {
				yield(api.Metrics{}, fmt.Errorf("watch metrics: %w", err))
				return
			}
			if sample.Error != "" {
				if !yield(api.Metrics{}, &MetricsError{sample.Error}) {
					return
				}
				continue
			}
			if !yield(sample.Metrics, nil) {
				return
			}
		}
		err = sc.Err()
		if err == nil || errors.Is(err, io.EOF) {
			if ctx.Err() == nil {
				yield(api.Metrics{}, fmt.Errorf("watch metrics: %w", io.ErrUnexpectedEOF))
			}
			return
		}
		if ctx.Err() == nil {
			yield(api.Metrics{}, fmt.Errorf("watch metrics: %w", err))
		}
	}
}
