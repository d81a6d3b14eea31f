package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"runtime/debug"
	"strings"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// argError is a mistake in a tool's arguments: the model can fix it and
// call again.
type argError struct{ msg string }

func (e *argError) Error() string { return "invalid arguments: " + e.msg }

func argErrorf(format string, args ...any) error {
	return &argError{msg: fmt.Sprintf(format, args...)}
}

// hinted adds advice for the model to an error.
type hinted struct {
	err  error
	hint string
}

func (h *hinted) Error() string { return h.err.Error() + ". " + h.hint }
func (h *hinted) Unwrap() error { return h.err }

// withHint returns err with advice that explain appends to its message.
func withHint(err error, hint string) error { return &hinted{err: err, hint: hint} }

// explain turns an error of the SDK into a message a model can act on:
// what went wrong, in words, and which tool call would help. sandboxID
// is the sandbox the call was about ("" for none). The server's error
// code and request id are kept at the end for people reading logs.
func (s *Server) explain(err error, sandboxID string) string {
	var ae *argError
	if errors.As(err, &ae) {
		return ae.Error()
	}
	var h *hinted
	if errors.As(err, &h) {
		return s.explain(h.err, sandboxID) + " " + h.hint
	}
	if errors.Is(err, sdk.ErrNoEgress) {
		return explainNoEgress(err, sandboxID)
	}
	if msg := explainVault(err, sandboxID); msg != "" {
		return msg
	}
	var apiErr *sdk.APIError
	if errors.As(err, &apiErr) {
		return s.explainAPI(apiErr, sandboxID)
	}
	var se *sdk.StateError
	if errors.As(err, &se) {
		return se.Error() + hintFor(se.Status.State, sandboxID)
	}
	switch {
	case errors.Is(err, context.Canceled):
		return "the call was cancelled before it finished: " + err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return "the call timed out: " + err.Error() + ". Check the sandbox with sandbox_get; for long work use command_start and poll command_logs."
	}
	var ne *sdk.NetworkError
	if errors.As(err, &ne) {
		return s.explainNetwork(ne, sandboxID)
	}
	var nerr net.Error
	if errors.As(err, &nerr) {
		return "network error: " + err.Error() + ". It may be temporary; try again."
	}
	return err.Error()
}

// explainAPI explains an error answer of the server or of a sandbox.
func (s *Server) explainAPI(e *sdk.APIError, sandboxID string) string {
	msg := e.Message
	if msg == "" {
		msg = e.Error()
	}
	var hint string
	switch {
	case errors.Is(e, sdk.ErrNotFound) && isSandboxNotFound(e.Code):
		if sandboxID != "" {
			msg = fmt.Sprintf("sandbox %s not found", sandboxID)
		}
		hint = "It may have expired or been killed. Call sandbox_list to see the sandboxes that exist, or sandbox_create for a new one."
	case errors.Is(e, sdk.ErrNotFound) && e.Code == api.CodePoolNotFound:
		hint = "Call pool_list to see the pools that exist, or create the sandbox from an image instead."
	case errors.Is(e, sdk.ErrNotFound) && e.Code == api.CodeFileNotFound:
		hint = "Check the path with file_list or file_search."
	case errors.Is(e, sdk.ErrNotFound) && e.Code == api.CodeContextNotFound:
		hint = "Call code_context_list to see the contexts, or run code_run without context_id to use the language's default context."
	case errors.Is(e, sdk.ErrNotFound):
		hint = "Check the ids and paths given."
	case errors.Is(e, sdk.ErrUnauthorized):
		hint = "The OpenSandbox server or sandbox refused the credentials osb mcp runs with; a person must fix its API key (OPEN_SANDBOX_API_KEY or osb config). Retrying will not help."
	case errors.Is(e, sdk.ErrConflict):
		hint = "The sandbox is not in a state that allows this. Call sandbox_get to see its state (a Paused sandbox needs sandbox_resume)."
	case errors.Is(e, sdk.ErrInvalid):
		hint = "The request was rejected as invalid; fix the arguments and try again."
	case errors.Is(e, sdk.ErrTooMany):
		hint = "Too many requests or too many sandboxes: wait a little, or kill sandboxes no longer needed (sandbox_list, sandbox_kill)."
	case errors.Is(e, sdk.ErrUnavailable):
		hint = "The server or sandbox is temporarily unavailable; try again in a few seconds."
	case errors.Is(e, sdk.ErrNotSupported):
		hint = "This server or sandbox does not support it."
	case errors.Is(e, sdk.ErrServer):
		hint = "The server failed; trying again may help."
	}
	var b strings.Builder
	b.WriteString(strings.TrimRight(msg, ". "))
	b.WriteString(".")
	if hint != "" {
		b.WriteString(" ")
		b.WriteString(hint)
	}
	var meta []string
	if e.Code != "" {
		meta = append(meta, "code "+e.Code)
	}
	meta = append(meta, fmt.Sprintf("HTTP %d", e.StatusCode))
	if e.RequestID != "" {
		meta = append(meta, "request id "+e.RequestID)
	}
	if e.Op != "" {
		meta = append([]string{e.Op}, meta...)
	}
	b.WriteString(" (" + strings.Join(meta, ", ") + ")")
	return b.String()
}

// isSandboxNotFound reports whether an error code says the sandbox itself
// is missing. Only the runtimes' codes say so: another 404, such as a
// server without the route asked for (api.CodeSandboxRouteNotFound), does
// not.
func isSandboxNotFound(code string) bool {
	return code == api.CodeDockerSandboxNotFound || code == api.CodeKubernetesSandboxNotFound
}

// explainNetwork explains a failure to reach the server or a sandbox.
func (s *Server) explainNetwork(ne *sdk.NetworkError, sandboxID string) string {
	base, _ := url.Parse(s.client.BaseURL())
	target, _ := url.Parse(ne.URL)
	if base != nil && target != nil && base.Host == target.Host {
		return fmt.Sprintf("cannot reach the OpenSandbox server at %s (%s: %v). The server may be down or its address wrong; a person must check it (osb config show). Retrying later may help.",
			base.Host, ne.Op, ne.Err)
	}
	if sandboxID != "" {
		return fmt.Sprintf("cannot reach sandbox %s (%s: %v). Call sandbox_get to see its state: a Paused sandbox needs sandbox_resume, a Pending one a moment more.",
			sandboxID, ne.Op, ne.Err)
	}
	return ne.Error() + ". It may be temporary; try again."
}

// hintFor suggests what to do about a sandbox that is in state.
func hintFor(state, sandboxID string) string {
	switch state {
	case sdk.StateFailed:
		return ". Call sandbox_kill to remove it and sandbox_create to try again (check the image name)."
	case sdk.StateTerminated:
		return ". It is gone; create a new one with sandbox_create."
	case sdk.StatePaused:
		return ". Call sandbox_resume with sandbox_id " + sandboxID + " first."
	}
	return "."
}

// tidyArgErrors rewrites the MCP SDK's schema validation errors for the
// model: "validating "arguments": validating root: validating
// /properties/port: maximum: 70000/1 is greater than 65535.000000"
// becomes "invalid arguments: port: maximum: 70000 is greater than
// 65535".
// guard is the outermost middleware: a tool call with null or absent
// arguments gets {} (the SDK would write defaults into a nil map and
// panic), and a panic anywhere below becomes an error answer instead of
// the end of the process and of every session it serves.
func guard(log *slog.Logger) gomcp.Middleware {
	return func(next gomcp.MethodHandler) gomcp.MethodHandler {
		return func(ctx context.Context, method string, req gomcp.Request) (res gomcp.Result, err error) {
			if call, ok := req.(*gomcp.CallToolRequest); ok && call.Params != nil {
				if a := bytes.TrimSpace(call.Params.Arguments); len(a) == 0 || bytes.Equal(a, []byte("null")) {
					call.Params.Arguments = json.RawMessage("{}")
				}
			}
			defer func() {
				if p := recover(); p != nil {
					log.Error("panic serving MCP request", "method", method, "panic", p, "stack", string(debug.Stack()))
					if method == "tools/call" {
						res, err = &gomcp.CallToolResult{IsError: true, Content: []gomcp.Content{&gomcp.TextContent{
							Text: fmt.Sprintf("internal error in osb mcp while serving this call (%v); the server keeps running — check the arguments and try again", p),
						}}}, nil
						return
					}
					res, err = nil, fmt.Errorf("internal error serving %s: %v", method, p)
				}
			}()
			return next(ctx, method, req)
		}
	}
}

func tidyArgErrors(next gomcp.MethodHandler) gomcp.MethodHandler {
	return func(ctx context.Context, method string, req gomcp.Request) (gomcp.Result, error) {
		res, err := next(ctx, method, req)
		if r, ok := res.(*gomcp.CallToolResult); ok && err == nil && r.IsError && len(r.Content) == 1 {
			if tc, ok := r.Content[0].(*gomcp.TextContent); ok {
				tc.Text = tidyValidation(tc.Text)
			}
		}
		return res, err
	}
}

var (
	propRE     = regexp.MustCompile(`validating /properties/([^:]+): `)
	ratRE      = regexp.MustCompile(`\b(-?\d+)/1\b`)
	wholeRE    = regexp.MustCompile(`\b(\d+)\.0+\b`)
	validateRE = regexp.MustCompile(`^validating "arguments": (validating root: )?`)
	nullRE     = regexp.MustCompile(`: type: <invalid reflect.Value> has type "null", want "(\w+)"`)
)

// tidyValidation rewrites one validation message; others pass as they
// are.
func tidyValidation(msg string) string {
	if !validateRE.MatchString(msg) {
		return msg
	}
	msg = validateRE.ReplaceAllString(msg, "")
	msg = propRE.ReplaceAllString(msg, "$1: ")
	msg = ratRE.ReplaceAllString(msg, "$1")
	msg = wholeRE.ReplaceAllString(msg, "$1")
	msg = strings.Replace(msg, "unexpected additional properties", "unknown arguments", 1)
	msg = strings.Replace(msg, "required: missing properties:", "missing required arguments:", 1)
	msg = strings.Replace(msg, `minLength: "" contains 0 Unicode code points, fewer than 1`, "must not be empty", 1)
	msg = nullRE.ReplaceAllString(msg, " is null: leave it out, or give a value of type $1")
	return "invalid arguments: " + msg + ". Check the tool's input schema."
}
