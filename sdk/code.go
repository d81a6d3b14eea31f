package sdk

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// Code languages the sandbox's code interpreter may offer.
const (
	LanguagePython     = "python"
	LanguageJavaScript = "javascript"
	LanguageTypeScript = "typescript"
	LanguageJava       = "java"
	LanguageGo         = "go"
	LanguageBash       = "bash"
)

// CreateCodeContext starts a stateful interpreter for language, working
// in cwd when not empty. Variables, imports and functions defined by one
// run are there for the next.
func (s *Sandbox) CreateCodeContext(ctx context.Context, language, cwd string) (*api.CodeContext, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r, err := tg.jsonReq("create "+language+" context in sandbox "+s.ID, http.MethodPost, "/code/context", nil,
		api.CodeContext{Language: language, Cwd: cwd})
	if err != nil {
		return nil, err
	}
	var out api.CodeContext
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CodeContexts lists the code contexts, of one language or (with "") of
// all.
func (s *Sandbox) CodeContexts(ctx context.Context, language string) ([]api.CodeContext, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if language != "" {
		q.Set("language", language)
	}
	r := tg.req("list code contexts in sandbox "+s.ID, http.MethodGet, "/code/contexts", q)
	r.idempotent = true
	var out []api.CodeContext
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// CodeContext returns one code context by id.
func (s *Sandbox) CodeContext(ctx context.Context, id string) (*api.CodeContext, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r := tg.req("get code context "+id, http.MethodGet, "/code/contexts/"+url.PathEscape(id), nil)
	r.idempotent = true
	var out api.CodeContext
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteCodeContext ends a code context and frees its interpreter.
func (s *Sandbox) DeleteCodeContext(ctx context.Context, id string) error {
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	r := tg.req("delete code context "+id, http.MethodDelete, "/code/contexts/"+url.PathEscape(id), nil)
	r.idempotent = true
	return s.c.t.call(ctx, r, nil)
}

// DeleteCodeContexts ends every code context of a language.
func (s *Sandbox) DeleteCodeContexts(ctx context.Context, language string) error {
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	r := tg.req("delete "+language+" contexts", http.MethodDelete, "/code/contexts", url.Values{"language": {language}})
	r.idempotent = true
	return s.c.t.call(ctx, r, nil)
}

// CodeOptions says where code runs and where its output goes.
type CodeOptions struct {
	// Context runs the code in this context (its ID and Language). With
	// only a Language the language's default context is used. Nil means
	// python's default context.
	Context *api.CodeContext
	// Stdout and Stderr receive output as it arrives; when both are nil
	// it is collected in the Execution.
	Stdout, Stderr io.Writer
	// OnEvent, when set, sees every event (pings excepted): results,
	// execution counts, errors.
	OnEvent func(api.Event)
	// Timeout interrupts the run after this long; zero means no limit.
	Timeout time.Duration
}

// StreamCode runs code and returns its live events.
func (s *Sandbox) StreamCode(ctx context.Context, code string, opts *CodeOptions) (*Stream, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	cc := &api.CodeContext{Language: LanguagePython}
	if opts != nil && opts.Context != nil {
		cc = &api.CodeContext{ID: opts.Context.ID, Language: opts.Context.Language}
		if cc.Language == "" {
			cc.Language = LanguagePython
		}
	}
	body := api.RunCodeRequest{Code: code, Context: cc}
	if opts != nil {
		body.Timeout = opts.Timeout.Milliseconds()
	}
	r, err := tg.jsonReq("run code in sandbox "+s.ID, http.MethodPost, "/code", nil, body)
	if err != nil {
		return nil, err
	}
	st, err := s.openStream(ctx, r, false, true)
	if err != nil {
		return nil, err
	}
	st.collect = opts == nil || (opts.Stdout == nil && opts.Stderr == nil)
	return st, nil
}

// RunCode runs code to its end. An exception in the code is not an
// error: see Execution.Error (ename, evalue, traceback). Results hold the
// values the code displayed, by MIME type.
func (s *Sandbox) RunCode(ctx context.Context, code string, opts *CodeOptions) (*Execution, error) {
	st, err := s.StreamCode(ctx, code, opts)
	if err != nil {
		return nil, err
	}
	var stdout, stderr io.Writer
	var onEvent func(api.Event)
	if opts != nil {
		stdout, stderr, onEvent = opts.Stdout, opts.Stderr, opts.OnEvent
	}
	return st.drain(stdout, stderr, onEvent)
}

// InterruptCode interrupts the code running in a context (or a command
// started through the code routes), by id.
func (s *Sandbox) InterruptCode(ctx context.Context, id string) error {
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	r := tg.req("interrupt code "+id, http.MethodDelete, "/code", url.Values{"id": {id}})
	return s.c.t.call(ctx, r, nil)
}
