// Package mcp serves OpenSandbox as Model Context Protocol tools, so that
// an agent built on any MCP client can create sandboxes and work in them
// without code of its own: sandboxes, commands, background commands,
// files, stateful code interpreters with images, and endpoints. It is
// built on the official MCP Go SDK and reaches servers only through
// package sdk. cmd/osb runs it as `osb mcp`; nothing else imports it.
package mcp

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// Config says which server the tools work on and with which defaults.
type Config struct {
	// Client reaches the OpenSandbox server; required.
	Client *sdk.Client
	// DefaultImage is the image sandbox_create uses when the model names
	// none; empty makes the image a required argument in practice.
	DefaultImage string
	// DefaultTimeout is the lifetime of a sandbox created without
	// timeout_seconds: sdk.DefaultTimeout when zero, unlimited with
	// sdk.NoTimeout.
	DefaultTimeout time.Duration
	// MaxOutput is the default number of characters of each output stream
	// a tool returns; DefaultMaxOutput when zero.
	MaxOutput int
	// Version is the version reported to clients.
	Version string
	// VaultCredentials are the operator's credentials, by name, that
	// vault_attach may put into a sandbox's credential vault. The tools
	// show their names only.
	VaultCredentials map[string]VaultCredential
	// Logger receives the server's own events (a tool's panic, a failed
	// transport); default: discarded.
	Logger *slog.Logger
}

// Server is the MCP server: every tool and the file resource template,
// ready to serve over stdio or HTTP.
type Server struct {
	cfg    Config
	client *sdk.Client
	log    *slog.Logger
	srv    *gomcp.Server
	// limits are the server's timeout bounds, read at start; nil when it
	// did not say (a server without GET /limits, or one that was down).
	limits *api.Limits

	mu sync.Mutex
	// attached maps {sandbox id, binding} to the credential vault_attach
	// bound, for vault_detach.
	attached map[[2]string]string
}

// instructions tell the model how the tools fit together.
const instructions = `These tools run work in OpenSandbox sandboxes: isolated Linux containers that you create, use and kill.
Typical flow: sandbox_create (note the returned sandbox_id) -> command_run, file_write, file_read, code_run -> sandbox_kill when done.
A sandbox expires after its timeout (sandbox_renew extends it); everything in it is lost when it is killed or expires.
Long-running work (servers, builds): command_start, then command_logs. Python/JavaScript/bash state persists between code_run calls.
A sandbox created with allowed_hosts reaches only those hosts; egress_get shows its policy, egress_allow, egress_deny and egress_remove change it.
To call an API that needs a credential, never ask for the secret: create the sandbox with credential_proxy, then vault_attach one of the operator's credentials by name to the API's hosts; requests from the sandbox then carry it, and you never see its value.
Errors come back as tool errors that say what to do next.`

// New returns a server with every tool registered.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("mcp: Config.Client is required")
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = DefaultMaxOutput
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, client: cfg.Client, log: log}
	lctx, cancel := context.WithTimeout(context.Background(), limitsWait)
	if l, err := cfg.Client.Limits(lctx); err == nil {
		s.limits = l
	} else {
		log.Warn("the server did not say its limits; tool schemas leave them out", "err", err)
	}
	cancel()
	s.srv = gomcp.NewServer(&gomcp.Implementation{
		Name:    "opensandbox",
		Title:   "OpenSandbox",
		Version: cmpOr(cfg.Version, sdk.Version),
	}, &gomcp.ServerOptions{Instructions: instructions, Logger: log})
	// The first middleware given is the outermost.
	s.srv.AddReceivingMiddleware(guard(log), tidyArgErrors)
	s.addSandboxTools()
	s.addPoolTools()
	s.addCommandTools()
	s.addFileTools()
	s.addCodeTools()
	s.addEgressTools()
	s.addVaultTools()
	s.addResources()
	return s, nil
}

// limitsWait bounds the wait for the server's limits at start.
const limitsWait = 3 * time.Second

// ServeStdio serves one client on in and out (newline-delimited JSON-RPC)
// until in ends or ctx is done.
func (s *Server) ServeStdio(ctx context.Context, in io.Reader, out io.Writer) error {
	t := &gomcp.IOTransport{Reader: io.NopCloser(in), Writer: nopWriteCloser{out}}
	err := s.srv.Run(ctx, t)
	if err != nil && (errors.Is(err, io.EOF) || ctx.Err() != nil) {
		return nil // the client went away, or we were told to stop
	}
	return err
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// HTTPPath is where the streamable HTTP transport is served.
const HTTPPath = "/mcp"

// Handler is the streamable HTTP transport at HTTPPath. Every request
// must carry "Authorization: Bearer TOKEN" unless token is empty.
func (s *Server) Handler(token string) http.Handler {
	h := gomcp.NewStreamableHTTPHandler(func(*http.Request) *gomcp.Server { return s.srv },
		&gomcp.StreamableHTTPOptions{Logger: s.log, SessionTimeout: 30 * time.Minute})
	mux := http.NewServeMux()
	mux.Handle(HTTPPath, http.NewCrossOriginProtection().Handler(h))
	if token == "" {
		return mux
	}
	return requireToken(token, mux)
}

// requireToken answers 401 to a request without the bearer token. The
// tokens are compared as SHA-256 digests in constant time, so that the
// time taken says nothing of the token, its length included.
func requireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !strings.EqualFold(scheme, "Bearer") {
			w.Header().Set("WWW-Authenticate", `Bearer realm="osb mcp"`)
			http.Error(w, "unauthorized: send the token of osb mcp as Authorization: Bearer TOKEN", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ServeStreamable serves the streamable HTTP transport on ln until ctx is
// done, then stops accepting and gives open requests a few seconds.
func (s *Server) ServeStreamable(ctx context.Context, ln net.Listener, token string) error {
	hs := &http.Server{Handler: s.Handler(token), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve MCP over HTTP: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	return nil
}

// readyWait bounds the wait for a Pending sandbox before a call into it.
const readyWait = 30 * time.Second

// running returns a handle on a sandbox that runs, for calls into it. A
// Pending sandbox is waited for; a paused, failed or missing one is an
// error that says what to do, at once rather than after a call into a
// frozen sandbox has timed out.
func (s *Server) running(ctx context.Context, id string) (*sdk.Sandbox, error) {
	info, err := s.client.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	sb := s.client.Sandbox(id)
	switch info.Status.State {
	case sdk.StateRunning:
		return sb, nil
	case sdk.StatePending:
		if err := sb.WaitReady(ctx, readyWait); err != nil {
			return nil, err
		}
		return sb, nil
	}
	return nil, &sdk.StateError{ID: id, Want: sdk.StateRunning, Status: info.Status}
}

// validator is an input that checks itself beyond what its JSON schema
// can say.
type validator interface{ validate() error }

// sandboxInput is an input naming a sandbox, for error messages.
type sandboxInput interface{ sandbox() string }

// SandboxArg is the sandbox_id argument most tools take.
type SandboxArg struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of the sandbox, as returned by sandbox_create or sandbox_list"`
}

func (a SandboxArg) sandbox() string { return a.SandboxID }

// handler is a tool's function: it returns the result (nil for the
// default, the output as indented JSON text) and the structured output.
type handler[In, Out any] func(ctx context.Context, in In) (*gomcp.CallToolResult, Out, error)

// add registers a tool whose input schema comes from In, adjusted by
// patches. Every tool takes max_output_chars, its output budget: In's own
// field when it has one, else a property added here, and text beyond the
// budget is cut at line boundaries (see budgetText). The handler never
// takes the server down: its errors become tool errors explained for the
// model, and a panic becomes a tool error too.
func add[In, Out any](s *Server, t *gomcp.Tool, h handler[In, Out], patches ...schemaPatch) {
	t.InputSchema = inputSchema[In](append(patches, s.budgetPatch)...)
	out, err := jsonschema.ForType(reflect.TypeFor[Out](), nil)
	if err != nil {
		panic(fmt.Sprintf("schema of %v: %v", reflect.TypeFor[Out](), err))
	}
	t.OutputSchema = noNullUnions(out)
	gomcp.AddTool(s.srv, t, func(ctx context.Context, req *gomcp.CallToolRequest, in In) (res *gomcp.CallToolResult, out Out, err error) {
		var zero Out
		id := ""
		if si, ok := any(in).(sandboxInput); ok {
			id = si.sandbox()
		}
		defer func() {
			if p := recover(); p != nil {
				s.log.Error("tool panicked", "tool", t.Name, "panic", p, "stack", string(debug.Stack()))
				res, out, err = nil, zero, fmt.Errorf("internal error in %s (a bug in osb mcp, not in your arguments): %v", t.Name, p)
			}
		}()
		if v, ok := any(in).(validator); ok {
			if err := v.validate(); err != nil {
				return nil, zero, errors.New(s.explain(err, id))
			}
		}
		budget := s.budgetOf(req)
		res, out, err = h(withBudget(ctx, budget), in)
		if err != nil {
			return nil, zero, errors.New(s.explain(err, id))
		}
		fillNil(reflect.ValueOf(&out).Elem())
		if res == nil {
			// The default text, the result as JSON, one field a line so
			// that the budget can cut it at lines.
			b, err := json.MarshalIndent(out, "", " ")
			if err != nil {
				return nil, zero, fmt.Errorf("internal error in %s: %v", t.Name, err)
			}
			res = text(string(b))
		}
		for _, c := range res.Content {
			if tc, ok := c.(*gomcp.TextContent); ok {
				tc.Text = budgetText(tc.Text, budget)
			}
		}
		return res, out, nil
	})
}

// budgetPatch gives an input schema the max_output_chars property, with
// the server's default, when its type has none of its own.
func (s *Server) budgetPatch(props map[string]*jsonschema.Schema) {
	p := props["max_output_chars"]
	if p == nil {
		p = &jsonschema.Schema{Type: "integer", Description: "output budget: at most this many characters of text are returned; longer output is cut at line boundaries with a note of what was left out and how to get the rest"}
		props["max_output_chars"] = p
	}
	lo, hi := float64(minMaxOutput), float64(maxMaxOutput)
	p.Minimum, p.Maximum = &lo, &hi
	p.Default = []byte(fmt.Sprint(s.cfg.MaxOutput))
}

// budgetOf is the call's max_output_chars, or the server's default. The
// schema has bounded it already.
func (s *Server) budgetOf(req *gomcp.CallToolRequest) int {
	var b struct {
		MaxOutputChars int `json:"max_output_chars"`
	}
	if req != nil && req.Params != nil && len(req.Params.Arguments) > 0 {
		_ = json.Unmarshal(req.Params.Arguments, &b)
	}
	return cmpInt(b.MaxOutputChars, s.cfg.MaxOutput)
}

type budgetKey struct{}

func withBudget(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, budgetKey{}, n)
}

// budget is the output budget of the tool call ctx belongs to.
func budget(ctx context.Context) int {
	if n, ok := ctx.Value(budgetKey{}).(int); ok && n > 0 {
		return n
	}
	return DefaultMaxOutput
}

// budgetSlack is how far a tool's text may exceed its budget before
// budgetText cuts it: room for the headers and notes around output that
// the tool has bounded itself.
const budgetSlack = 2000

// budgetText cuts a text longer than the budget (plus slack) at line
// boundaries, keeping its start and end.
func budgetText(text string, budget int) string {
	if utf8.RuneCountInString(text) <= budget+budgetSlack {
		return text
	}
	out, _ := truncate(text, budget)
	return out + fmt.Sprintf("\n[the tool's text was longer than max_output_chars %d; pass a larger max_output_chars (at most %d) or narrow the request]", budget, maxMaxOutput)
}

// noNullUnions rewrites every type ["null", T] of a schema, which some
// function-calling backends refuse, as T: the field is then left out
// rather than null (fillNil sees to it in results).
func noNullUnions(sc *jsonschema.Schema) *jsonschema.Schema {
	if sc == nil {
		return nil
	}
	if len(sc.Types) == 2 && slices.Contains(sc.Types, "null") {
		sc.Type = sc.Types[0]
		if sc.Type == "null" {
			sc.Type = sc.Types[1]
		}
		sc.Types = nil
	}
	for _, p := range sc.Properties {
		noNullUnions(p)
	}
	noNullUnions(sc.Items)
	if sc.AdditionalProperties != nil {
		noNullUnions(sc.AdditionalProperties)
	}
	for _, d := range sc.Defs {
		noNullUnions(d)
	}
	return sc
}

// fillNil makes the nil slices and maps of v that JSON would write as
// null empty instead, so that a result matches its schema without null
// unions. Fields tagged omitempty are left out when nil and stay nil.
func fillNil(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			fillNil(v.Elem())
		}
	case reflect.Slice:
		if v.IsNil() && v.CanSet() {
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
		}
		for i := range v.Len() {
			fillNil(v.Index(i))
		}
	case reflect.Map:
		if v.IsNil() && v.CanSet() {
			v.Set(reflect.MakeMap(v.Type()))
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			fv := v.Field(i)
			if strings.Contains(f.Tag.Get("json"), ",omitempty") && (fv.Kind() == reflect.Slice || fv.Kind() == reflect.Map) && fv.IsNil() {
				continue
			}
			fillNil(fv)
		}
	}
}

// schemaPatch adjusts the properties of an input schema.
type schemaPatch func(props map[string]*jsonschema.Schema)

// inputSchema is the JSON schema of T: every required string must be
// non-empty, then patches apply.
func inputSchema[T any](patches ...schemaPatch) *jsonschema.Schema {
	sc, err := jsonschema.ForType(reflect.TypeFor[T](), nil)
	if err != nil {
		panic(fmt.Sprintf("schema of %v: %v", reflect.TypeFor[T](), err))
	}
	if sc.Properties == nil {
		sc.Properties = map[string]*jsonschema.Schema{}
	}
	one := 1
	for _, name := range sc.Required {
		if p := sc.Properties[name]; p != nil && p.Type == "string" {
			p.MinLength = &one
		}
	}
	for _, p := range patches {
		p(sc.Properties)
	}
	return noNullUnions(sc)
}

// enum limits a string property to values.
func enum(name string, values ...string) schemaPatch {
	return func(props map[string]*jsonschema.Schema) {
		for _, v := range values {
			props[name].Enum = append(props[name].Enum, v)
		}
	}
}

// between limits a number property to [lo, hi].
func between(name string, lo, hi float64) schemaPatch {
	return func(props map[string]*jsonschema.Schema) {
		props[name].Minimum, props[name].Maximum = &lo, &hi
	}
}

// defaultValue documents a property's default (raw JSON).
func defaultValue(name, raw string) schemaPatch {
	return func(props map[string]*jsonschema.Schema) {
		props[name].Default = []byte(raw)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func ptr[T any](v T) *T { return &v }

// text is a result holding one text block.
func text(s string) *gomcp.CallToolResult {
	return &gomcp.CallToolResult{Content: []gomcp.Content{&gomcp.TextContent{Text: s}}}
}
