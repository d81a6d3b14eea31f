package execd

import (
	"context"
	"errors"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/interp"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// Pseudo-languages of POST /code that run the code as a shell command.
const (
	langCommand           = "command"
	langBackgroundCommand = "background-command"
	langBash              = "bash"
)

// maxRunTimeout bounds a run's timeout, so that no value overflows.
const maxRunTimeout = 365 * 24 * time.Hour

// maxDeadContexts bounds how many ids of contexts whose interpreter died
// are remembered, to tell "died" from "never existed" in a 404.
const maxDeadContexts = 256

// codeContext is a context of the /code routes: an interpreter with its
// state (python, javascript, typescript, java, go) or a persistent bash shell.
type codeContext struct {
	id       string
	language string
	cwd      string
	created  time.Time
	// isDefault marks the context that runs code sent with a language
	// and no context id.
	isDefault bool

	interp *interp.Context // python, javascript, typescript, java, go
	bash   *session        // bash
}

func (cc *codeContext) info() api.CodeContext {
	return api.CodeContext{ID: cc.id, Language: cc.language}
}

// close ends the context and everything it started.
func (cc *codeContext) close() {
	if cc.interp != nil {
		cc.interp.Close()
	}
	if cc.bash != nil {
		cc.bash.close()
	}
}

// codeTable holds the code contexts.
type codeTable struct {
	max int

	mu       sync.Mutex
	byID     map[string]*codeContext
	defaults map[string]*codeContext // by language
	starting int                     // contexts being started, counted against max
	dead     map[string]string       // id -> how its interpreter ended
	closed   bool

	// defaultMu makes concurrent first uses of a language start one
	// default context.
	defaultMu sync.Mutex
}

func newCodeTable(max int) *codeTable {
	return &codeTable{
		max:      max,
		byID:     make(map[string]*codeContext),
		defaults: make(map[string]*codeContext),
		dead:     make(map[string]string),
	}
}

func (t *codeTable) get(id string) *codeContext {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}

// notFound is the 404 for an id that names no context, saying why when
// the context's interpreter died.
func (t *codeTable) notFound(id string) error {
	t.mu.Lock()
	reason := t.dead[id]
	t.mu.Unlock()
	if reason != "" {
		return httpx.Errorf(http.StatusNotFound, api.CodeContextNotFound, "context %s not found: %s", id, reason)
	}
	return httpx.Errorf(http.StatusNotFound, api.CodeContextNotFound, "context %s not found", id)
}

// remove forgets a context; it reports whether it was there.
func (t *codeTable) remove(cc *codeContext) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID[cc.id] != cc {
		return false
	}
	delete(t.byID, cc.id)
	if t.defaults[cc.language] == cc {
		delete(t.defaults, cc.language)
	}
	return true
}

// list returns the contexts of language (all when empty), oldest first.
func (t *codeTable) list(language string) []*codeContext {
	t.mu.Lock()
	var out []*codeContext
	for _, cc := range t.byID {
		if language == "" || cc.language == language {
			out = append(out, cc)
		}
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b *codeContext) int { return a.created.Compare(b.created) })
	return out
}

// closeAll ends every context; no context can be made afterwards.
func (t *codeTable) closeAll() {
	t.mu.Lock()
	t.closed = true
	all := t.byID
	t.byID = make(map[string]*codeContext)
	t.defaults = make(map[string]*codeContext)
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, cc := range all {
		wg.Go(cc.close)
	}
	wg.Wait()
}

// codeLanguages returns the languages contexts can be made for: those with
// a driver, and bash.
func codeLanguages() []string {
	langs := append(interp.Languages(), langBash)
	slices.Sort(langs)
	return langs
}

// checkLanguage rejects a language no context can be made for.
func checkLanguage(language string) error {
	if language == "" {
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "language is required; offered: %s", strings.Join(codeLanguages(), ", "))
	}
	if !slices.Contains(codeLanguages(), language) {
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "unknown language %q; offered: %s", language, strings.Join(codeLanguages(), ", "))
	}
	return nil
}

// newCodeContext starts a context of language in dir and registers it.
func (s *Server) newCodeContext(ctx context.Context, language, dir string, isDefault bool) (*codeContext, error) {
	t := s.code
	t.mu.Lock()
	switch {
	case t.closed:
		t.mu.Unlock()
		return nil, httpx.Errorf(http.StatusServiceUnavailable, api.CodeRuntimeError, "execd is shutting down")
	case len(t.byID)+t.starting >= t.max:
		t.mu.Unlock()
		return nil, httpx.Errorf(http.StatusConflict, api.CodeTooManyContexts,
			"this sandbox already has %d code contexts, the most it allows (--max-code-contexts); delete one first", t.max)
	}
	t.starting++
	t.mu.Unlock()

	cc := &codeContext{id: newID(), language: language, cwd: dir, isDefault: isDefault}
	err := s.startCodeContext(ctx, cc)

	t.mu.Lock()
	t.starting--
	if err == nil && t.closed {
		err = httpx.Errorf(http.StatusServiceUnavailable, api.CodeRuntimeError, "execd is shutting down")
	}
	if err != nil {
		t.mu.Unlock()
		if cc.interp != nil || cc.bash != nil {
			cc.close()
		}
		return nil, err
	}
	cc.created = time.Now()
	t.byID[cc.id] = cc
	if isDefault {
		t.defaults[language] = cc
	}
	t.mu.Unlock()

	if cc.interp != nil {
		go func() {
			// An interpreter that exits takes its context with it.
			<-cc.interp.Done()
			if t.remove(cc) {
				t.mu.Lock()
				if len(t.dead) >= maxDeadContexts {
					clear(t.dead)
				}
				t.dead[cc.id] = cc.interp.DeathReason()
				t.mu.Unlock()
				s.log.Info("code context died", "id", cc.id, "language", cc.language, "reason", cc.interp.DeathReason())
			}
		}()
	}
	return cc, nil
}

// startCodeContext starts cc's interpreter or shell.
func (s *Server) startCodeContext(ctx context.Context, cc *codeContext) error {
	if cc.language == langBash {
		ss := &session{id: cc.id, dir: cc.cwd, raw: true, run: make(chan struct{}, 1)}
		ss.mu.Lock()
		err := s.startShell(ss)
		ss.mu.Unlock()
		if err != nil {
			return httpx.Errorf(http.StatusInternalServerError, api.CodeRuntimeError, "start bash context: %w", err)
		}
		cc.bash = ss
		return nil
	}
	ic, err := interp.Start(ctx, interp.Options{
		Language:   cc.language,
		Dir:        cc.cwd,
		Env:        s.env.build(nil, nil),
		Supervisor: s.sup,
		DriverDir:  s.priv,
	})
	var missing *interp.NotInstalledError
	switch {
	case errors.As(err, &missing):
		return httpx.Errorf(http.StatusNotImplemented, api.CodeNotSupported, "cannot run %s here: %w", cc.language, err)
	case errors.Is(err, interp.ErrUnknownLanguage):
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "%w", err)
	case err != nil:
		return httpx.Errorf(http.StatusInternalServerError, api.CodeRuntimeError, "%w", err)
	}
	cc.interp = ic
	return nil
}

// defaultContext returns language's default context, starting it on first
// use (and again after its interpreter died).
func (s *Server) defaultContext(ctx context.Context, language string) (*codeContext, error) {
	t := s.code
	t.defaultMu.Lock()
	defer t.defaultMu.Unlock()
	t.mu.Lock()
	cc := t.defaults[language]
	t.mu.Unlock()
	if cc != nil {
		return cc, nil
	}
	return s.newCodeContext(ctx, language, s.env.cwd, true)
}

// createCodeContext serves POST /code/context.
func (s *Server) createCodeContext(w http.ResponseWriter, r *http.Request) error {
	var req api.CodeContext
	if err := httpx.DecodeJSON(w, r, &req, 0, false); err != nil {
		return err
	}
	if err := checkLanguage(req.Language); err != nil {
		return err
	}
	dir := s.env.cwd
	if req.Cwd != "" {
		var err error
		if dir, err = s.resolvePath(req.Cwd); err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "create cwd: %w", err)
		}
	}
	cc, err := s.newCodeContext(r.Context(), req.Language, dir, false)
	if err != nil {
		return err
	}
	resp := cc.info()
	if req.Cwd != "" {
		resp.Cwd = dir
	}
	httpx.WriteJSON(w, http.StatusOK, resp)
	return nil
}

// listCodeContexts serves GET /code/contexts[?language=].
func (s *Server) listCodeContexts(w http.ResponseWriter, r *http.Request) error {
	out := []api.CodeContext{}
	for _, cc := range s.code.list(r.URL.Query().Get("language")) {
		out = append(out, cc.info())
	}
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

// deleteCodeContexts serves DELETE /code/contexts?language=: every context
// of the language goes, its default context included.
func (s *Server) deleteCodeContexts(w http.ResponseWriter, r *http.Request) error {
	language := r.URL.Query().Get("language")
	if language == "" {
		return httpx.Errorf(http.StatusBadRequest, api.CodeMissingQuery, "missing query parameter language")
	}
	var wg sync.WaitGroup
	for _, cc := range s.code.list(language) {
		if s.code.remove(cc) {
			wg.Go(cc.close)
		}
	}
	wg.Wait()
	return nil
}

// getCodeContext serves GET /code/contexts/{id}.
func (s *Server) getCodeContext(w http.ResponseWriter, r *http.Request) error {
	cc := s.code.get(r.PathValue("id"))
	if cc == nil {
		return s.code.notFound(r.PathValue("id"))
	}
	httpx.WriteJSON(w, http.StatusOK, cc.info())
	return nil
}

// deleteCodeContext serves DELETE /code/contexts/{id}: the context's
// processes are killed, a run in progress ends with an error.
func (s *Server) deleteCodeContext(w http.ResponseWriter, r *http.Request) error {
	cc := s.code.get(r.PathValue("id"))
	if cc == nil || !s.code.remove(cc) {
		return s.code.notFound(r.PathValue("id"))
	}
	cc.close()
	return nil
}

// runCode serves POST /code. Code with no language (or "command") runs as
// a foreground shell command, as in the reference daemon, even when a
// context id is given; with a context id it runs in that context whatever
// the language says; with a language alone, in the language's default
// context.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request) error {
	var req api.RunCodeRequest
	if err := httpx.DecodeJSON(w, r, &req, 0, false); err != nil {
		return err
	}
	switch {
	case req.Code == "":
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "code is required")
	case req.Timeout < 0:
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "timeout must not be negative")
	}
	var language, id string
	if req.Context != nil {
		language, id = req.Context.Language, req.Context.ID
	}
	switch language {
	case "", langCommand, langBackgroundCommand:
		p, err := s.prepareCommand(api.RunCommandRequest{Command: req.Code, Timeout: req.Timeout})
		if err != nil {
			return err
		}
		if language == langBackgroundCommand {
			return s.startBackground(w, p)
		}
		return s.runForeground(w, r, p)
	}

	var cc *codeContext
	if id != "" {
		if cc = s.code.get(id); cc == nil {
			return s.code.notFound(id)
		}
	} else {
		if err := checkLanguage(language); err != nil {
			return err
		}
		var err error
		if cc, err = s.defaultContext(r.Context(), language); err != nil {
			return err
		}
	}
	timeout := time.Duration(min(req.Timeout, maxRunTimeout.Milliseconds())) * time.Millisecond

	st := newOutputStream()
	defer st.detach()
	go func() {
		defer st.close()
		started := time.Now()
		if cc.bash != nil {
			if !s.runBash(r.Context(), cc, st, req.Code, timeout) {
				return
			}
		} else if cc.interp.Run(r.Context(), req.Code, timeout, st.send) != nil {
			return // the client left before the run's turn came
		}
		st.send(api.Event{Type: api.EventComplete, ExecutionTime: time.Since(started).Milliseconds(), Timestamp: time.Now().UnixMilli()})
	}()
	ew := httpx.NewEventWriter(w)
	if err := ew.Send(api.Event{Type: api.EventInit, Text: cc.id, Timestamp: time.Now().UnixMilli()}, pong()); err != nil {
		return nil
	}
	s.pump(r, ew, st)
	return nil
}

// runBash runs code in a bash context's shell, sending its output and,
// when it fails, status and error events; it reports false when the client
// left before the run's turn came.
func (s *Server) runBash(ctx context.Context, cc *codeContext, st *outputStream, code string, timeout time.Duration) bool {
	ss := cc.bash
	select {
	case ss.run <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-ss.run }()
	if timeout <= 0 {
		timeout = sessionRunCap
	}
	term, timedOut := s.sessionRun(ss, st, code, "", timeout)
	if timedOut {
		// As in the other languages' contexts.
		term.Error.EName = interp.ENameTimeout
	}
	if term.Type == api.EventError {
		now := time.Now().UnixMilli()
		term.Timestamp = now
		st.send(api.Event{Type: api.EventStatus, Text: "error", Timestamp: now}, term)
	}
	return true
}

// interruptCode stops the run in progress in a code context, if any; it
// reports whether id names a context.
func (s *Server) interruptCode(id string) bool {
	cc := s.code.get(id)
	if cc == nil {
		return false
	}
	if cc.interp != nil {
		cc.interp.Interrupt()
		return true
	}
	ss := cc.bash
	ss.mu.Lock()
	sh := ss.sh
	ss.mu.Unlock()
	if sh != nil && len(ss.run) > 0 {
		// The shell's trap turns SIGINT into the end of the sourced run.
		sh.proc.Signal(syscall.SIGINT)
	}
	return true
}
