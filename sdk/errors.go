package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/opensandbox/opensandbox/api"
)

// Error kinds an *APIError matches with errors.Is, whatever the exact
// code string of the server or sandbox that answered.
var (
	ErrNotFound     = errors.New("not found")         // 404
	ErrUnauthorized = errors.New("unauthorized")      // 401, 403
	ErrConflict     = errors.New("conflict")          // 409
	ErrInvalid      = errors.New("invalid request")   // 400, 413, 416, 422
	ErrUnavailable  = errors.New("unavailable")       // 502, 503, 504
	ErrNotSupported = errors.New("not supported")     // 501
	ErrServer       = errors.New("server error")      // other 5xx
	ErrTooMany      = errors.New("too many requests") // 429
)

// APIError is an error answer from the lifecycle server, a sandbox's
// execd or its egress API.
type APIError struct {
	// Op says what was being done ("get sandbox 3f0c...").
	Op string
	// StatusCode is the HTTP status.
	StatusCode int
	// Code is the error code of the body, such as
	// "DOCKER::SANDBOX_NOT_FOUND" or "FILE_NOT_FOUND"; empty when the body
	// had none (execd's 401, the egress API's plain-text errors).
	Code string
	// Message is the server's message, or the start of a body that was
	// not an error envelope.
	Message string
	// RequestID is the server's X-Request-ID for the request, to quote
	// when asking the server's operators.
	RequestID string
}

// Error reads "OP: MESSAGE [CODE] (HTTP STATUS, request_id=ID)", leaving
// out what is unknown.
func (e *APIError) Error() string {
	var b strings.Builder
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	b.WriteString(cmpStr(e.Message, http.StatusText(e.StatusCode)))
	if e.Code != "" {
		b.WriteString(" [")
		b.WriteString(e.Code)
		b.WriteString("]")
	}
	fmt.Fprintf(&b, " (HTTP %d", e.StatusCode)
	if e.RequestID != "" {
		b.WriteString(", request_id=")
		b.WriteString(e.RequestID)
	}
	b.WriteString(")")
	return b.String()
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Is matches the error kind of the status: ErrNotFound for a 404 and so
// on, as the variables say; a sandbox refusing access to one of its files
// (403 PERMISSION_DENIED) matches fs.ErrPermission instead of
// ErrUnauthorized, which is about the caller's credentials.
func (e *APIError) Is(target error) bool {
	if e.Code == api.CodePermissionDenied {
		return target == fs.ErrPermission
	}
	return target != nil && kindOf(e.StatusCode) == target
}

func kindOf(status int) error {
	switch {
	case status == http.StatusNotFound:
		return ErrNotFound
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return ErrUnauthorized
	case status == http.StatusConflict:
		return ErrConflict
	case status == http.StatusTooManyRequests:
		return ErrTooMany
	case status == http.StatusNotImplemented:
		return ErrNotSupported
	case status == http.StatusBadGateway, status == http.StatusServiceUnavailable, status == http.StatusGatewayTimeout:
		return ErrUnavailable
	case status >= 500:
		return ErrServer
	case status >= 400:
		return ErrInvalid
	}
	return nil
}

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 64 << 10

// errorFrom reads an error answer into an *APIError. It understands the
// {code,message} envelope, execd's {"error":...} 401 body, a FastAPI
// {"detail":[...]} validation body and plain text.
func errorFrom(op string, resp *http.Response) *APIError {
	e := &APIError{Op: op, StatusCode: resp.StatusCode, RequestID: resp.Header.Get(api.HeaderRequestID)}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var env struct {
		Code    string          `json:"code"`
		Message string          `json:"message"`
		Error   string          `json:"error"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &env) == nil {
		e.Code = env.Code
		e.Message = cmpStr(env.Message, env.Error)
		if e.Message == "" && len(env.Detail) > 0 {
			e.Message = detailMessage(env.Detail)
		}
		if e.Message != "" || e.Code != "" {
			return e
		}
	}
	e.Message = plainMessage(body)
	return e
}

// detailMessage summarises a FastAPI "detail": a string, or a list of
// {loc, msg} objects.
func detailMessage(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var items []struct {
		Loc []any  `json:"loc"`
		Msg string `json:"msg"`
	}
	if json.Unmarshal(raw, &items) != nil {
		return plainMessage(raw)
	}
	var parts []string
	for _, it := range items {
		loc := make([]string, 0, len(it.Loc))
		for _, l := range it.Loc {
			loc = append(loc, fmt.Sprint(l))
		}
		parts = append(parts, strings.Join(loc, ".")+": "+it.Msg)
	}
	return strings.Join(parts, "; ")
}

// plainMessage is the first 512 bytes of a body, on one line.
func plainMessage(body []byte) string {
	s := strings.Join(strings.Fields(string(body)), " ")
	if len(s) > 512 {
		cut := 512
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}
