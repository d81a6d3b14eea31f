// Package httpx holds the HTTP plumbing shared by this module's servers:
// bounded JSON decoding, the {code,message} error envelope, JSON answers and
// the event-stream writer. Any server package may import it.
package httpx

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/opensandbox/opensandbox/api"
)

// DefaultMaxBody is the body limit of DecodeJSON: 8 MiB.
const DefaultMaxBody = 8 << 20

// Error is an error with the HTTP status and code to answer it with.
type Error struct {
	Status  int
	Code    string
	Message string
	// Err is the cause, logged but never sent to the client.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil && !strings.HasSuffix(e.Message, e.Err.Error()) {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with a formatted message. A %w verb keeps the
// cause for errors.Is, and its text is part of the message.
func Errorf(status int, code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Status: status, Code: code, Message: err.Error(), Err: errors.Unwrap(err)}
}

// StatusOf returns the status that WriteError would answer err with.
func StatusOf(err error) int {
	var he *Error
	if errors.As(err, &he) {
		return he.Status
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusInternalServerError
}

// WriteError answers err as a JSON {code,message} body. An *Error gives the
// status and code; any other error is a 500 with code RUNTIME_ERROR.
func WriteError(w http.ResponseWriter, err error) {
	resp := api.ErrorResponse{Code: api.CodeRuntimeError, Message: err.Error()}
	var he *Error
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &he):
		resp = api.ErrorResponse{Code: he.Code, Message: he.Message}
	case errors.As(err, &mbe):
		resp = api.ErrorResponse{Code: api.CodeRequestTooLarge, Message: fmt.Sprintf("request body larger than %d bytes", mbe.Limit)}
	}
	WriteJSON(w, StatusOf(err), resp)
}

// WriteJSON answers v as JSON with the given status. It marshals before
// writing the header, so an encoding failure still becomes a clean 500.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(api.ErrorResponse{Code: api.CodeRuntimeError, Message: "encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// DecodeJSON decodes the request body into v, reading at most max bytes
// (DefaultMaxBody when max is 0). Bad JSON, trailing data and an oversized
// body become a 400 (413 for size) *Error with code INVALID_REQUEST_BODY.
// When optional is set, an empty body leaves v unchanged.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any, max int64, optional bool) error {
	if max <= 0 {
		max = DefaultMaxBody
	}
	body := http.MaxBytesReader(w, r.Body, max)
	data, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &Error{Status: http.StatusRequestEntityTooLarge, Code: api.CodeRequestTooLarge,
				Message: fmt.Sprintf("request body larger than %d bytes", max)}
		}
		return Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "read request body: %w", err)
	}
	if optional && strings.TrimSpace(string(data)) == "" {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "invalid JSON body: %w", err)
	}
	return nil
}

// RequestID returns the client's request id (X-Request-ID) when it is 1
// to 128 printable ASCII characters, else a new one of 32 lower-case hex
// digits: the id a server logs and echoes for the request.
func RequestID(client string) string {
	if n := len(client); n >= 1 && n <= 128 {
		ok := true
		for i := 0; i < n && ok; i++ {
			ok = client[i] >= 0x20 && client[i] <= 0x7e
		}
		if ok {
			return client
		}
	}
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
