package httpx

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

func TestDecodeJSON(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		max      int64
		optional bool
		status   int // 0: success
		code     string
	}{
		{"valid", `{"command":"x"}`, 0, false, 0, ""},
		{"malformed", `{"command":`, 0, false, 400, api.CodeInvalidRequestBody},
		{"wrong type", `{"command":1}`, 0, false, 400, api.CodeInvalidRequestBody},
		{"empty required", ``, 0, false, 400, api.CodeInvalidRequestBody},
		{"empty optional", `  `, 0, true, 0, ""},
		{"too large", `{"command":"` + strings.Repeat("x", 100) + `"}`, 50, false, 413, api.CodeRequestTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", strings.NewReader(tt.body))
			var v api.RunCommandRequest
			err := DecodeJSON(httptest.NewRecorder(), r, &v, tt.max, tt.optional)
			if tt.status == 0 {
				if err != nil {
					t.Fatalf("DecodeJSON: %v", err)
				}
				return
			}
			var he *Error
			if !errors.As(err, &he) || he.Status != tt.status || he.Code != tt.code {
				t.Fatalf("DecodeJSON error %v, want %d %s", err, tt.status, tt.code)
			}
		})
	}
}

func TestWriteError(t *testing.T) {
	for _, tt := range []struct {
		err    error
		status int
		code   string
	}{
		{Errorf(404, api.CodeFileNotFound, "no %s", "x"), 404, api.CodeFileNotFound},
		{errors.New("boom"), 500, api.CodeRuntimeError},
		{&http.MaxBytesError{Limit: 5}, 413, api.CodeRequestTooLarge},
	} {
		rec := httptest.NewRecorder()
		WriteError(rec, tt.err)
		var body api.ErrorResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != tt.status || body.Code != tt.code || body.Message == "" {
			t.Errorf("WriteError(%v) = %d %s, want %d %s", tt.err, rec.Code, rec.Body, tt.status, tt.code)
		}
	}
}

func TestEventWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	ew := NewEventWriter(rec)
	if err := ew.Send(api.Event{Type: api.EventInit, Text: "id"}, api.Event{Type: api.EventPing, Text: "pong", Timestamp: 7}); err != nil {
		t.Fatal(err)
	}
	if rec.Header().Get("Content-Type") != "text/event-stream" || rec.Header().Get("X-Accel-Buffering") != "no" || !rec.Flushed {
		t.Fatalf("headers %v, flushed %v", rec.Header(), rec.Flushed)
	}
	frames := strings.Split(rec.Body.String(), "\n\n")
	if len(frames) != 3 || frames[2] != "" || !strings.HasPrefix(frames[0], `{"type":"init","text":"id","timestamp":`) || frames[1] != `{"type":"ping","text":"pong","timestamp":7}` {
		t.Fatalf("body %q", rec.Body.String())
	}
}

func TestRequestID(t *testing.T) {
	for _, c := range []string{"abc", strings.Repeat("x", 128), "a b~"} {
		if got := RequestID(c); got != c {
			t.Errorf("RequestID(%q) = %q, want it kept", c, got)
		}
	}
	for _, c := range []string{"", strings.Repeat("x", 129), "a\nb", "é"} {
		got := RequestID(c)
		if got == c || len(got) != 32 || strings.Trim(got, "0123456789abcdef") != "" {
			t.Errorf("RequestID(%q) = %q, want a new 32-hex-digit id", c, got)
		}
	}
}
