package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// fakeLifecycle is a lifecycle server with warm pools, as far as the
// pooled rows use it, and an execd for all its sandboxes. A pool refills
// one sandbox per GET of its status.
type fakeLifecycle struct {
	t      *testing.T
	noPool bool // answer 501 on /pools

	mu        sync.Mutex
	pool      *api.PoolRequest
	available int
	allocated int
	sandboxes map[string]bool
	next      int
	emptyTake int // creates that found the pool empty
	commands  int
}

func newFake(t *testing.T, noPool bool) (*fakeLifecycle, *server) {
	f := &fakeLifecycle{t: t, noPool: noPool, sandboxes: map[string]bool{}}
	execd := httptest.NewServer(http.HandlerFunc(f.execd))
	t.Cleanup(execd.Close)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/pools", f.createPool)
	mux.HandleFunc("GET /v1/pools/{name}", f.getPool)
	mux.HandleFunc("DELETE /v1/pools/{name}", f.deletePool)
	mux.HandleFunc("POST /v1/sandboxes", f.create)
	mux.HandleFunc("GET /v1/sandboxes/{id}", f.get)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", f.delete)
	mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/{port}", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Endpoint{Endpoint: strings.TrimPrefix(execd.URL, "http://"), Headers: map[string]string{api.HeaderExecdToken: "tok"}})
	})
	lifecycle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(api.HeaderAPIKey) != "key" {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		if f.noPool && strings.HasPrefix(r.URL.Path, "/v1/pools") {
			http.Error(w, `{"code":"`+api.CodePoolNotImplemented+`"}`, http.StatusNotImplemented)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(lifecycle.Close)
	c, err := benchkit.NewClient(strings.TrimPrefix(lifecycle.URL, "http://"), "key", 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return f, &server{c: c}
}

func (f *fakeLifecycle) createPool(w http.ResponseWriter, r *http.Request) {
	var req api.PoolRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Template == nil || req.CapacitySpec == nil {
		f.t.Errorf("pool request %+v", req)
		http.Error(w, "bad pool", http.StatusBadRequest)
		return
	}
	c := req.CapacitySpec
	if req.Name != poolName || req.Template.Image == nil || req.Template.Image.URI != image ||
		c.BufferMin <= 0 || c.BufferMax < c.BufferMin || c.PoolMax < c.BufferMax || req.Template.ResourceLimits["memory"] != "256Mi" {
		f.t.Errorf("pool request %+v", req)
		http.Error(w, "bad pool", http.StatusBadRequest)
		return
	}
	if f.pool != nil {
		http.Error(w, "exists", http.StatusConflict)
		return
	}
	f.pool, f.available, f.allocated = &req, 0, 0
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(api.Pool{Name: req.Name, CapacitySpec: *c})
}

func (f *fakeLifecycle) getPool(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pool == nil || r.PathValue("name") != poolName {
		http.Error(w, "no pool", http.StatusNotFound)
		return
	}
	if f.available < f.pool.CapacitySpec.BufferMin {
		f.available++
	}
	json.NewEncoder(w).Encode(api.Pool{Name: poolName, CapacitySpec: *f.pool.CapacitySpec,
		Status: &api.PoolStatus{Total: f.available + f.allocated, Allocated: f.allocated, Available: f.available}})
}

func (f *fakeLifecycle) deletePool(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pool == nil {
		http.Error(w, "no pool", http.StatusNotFound)
		return
	}
	f.pool = nil
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeLifecycle) create(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSandboxRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Extensions["poolRef"] != poolName || f.pool == nil || req.Timeout == nil {
		f.t.Errorf("create request %+v", req)
		http.Error(w, "bad create", http.StatusBadRequest)
		return
	}
	if f.available == 0 {
		f.emptyTake++
	} else {
		f.available--
	}
	f.allocated++
	f.next++
	id := "sb-" + strconv.Itoa(f.next)
	f.sandboxes[id] = true
	w.WriteHeader(http.StatusAccepted)
	json.NewEncoder(w).Encode(api.CreateSandboxResponse{ID: id, Status: api.SandboxStatus{State: "Pending"}})
}

func (f *fakeLifecycle) get(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := r.PathValue("id")
	if !f.sandboxes[id] {
		http.Error(w, "no sandbox", http.StatusNotFound)
		return
	}
	json.NewEncoder(w).Encode(api.Sandbox{ID: id, Status: api.SandboxStatus{State: "Running"}})
}

func (f *fakeLifecycle) delete(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.sandboxes[r.PathValue("id")] {
		http.Error(w, "no sandbox", http.StatusNotFound)
		return
	}
	delete(f.sandboxes, r.PathValue("id"))
	f.allocated--
	w.WriteHeader(http.StatusNoContent)
}

// execd answers POST /command with init and completion.
func (f *fakeLifecycle) execd(w http.ResponseWriter, r *http.Request) {
	var req api.RunCommandRequest
	if r.URL.Path != "/command" || r.Header.Get(api.HeaderExecdToken) != "tok" || json.NewDecoder(r.Body).Decode(&req) != nil || req.Command != "true" {
		http.Error(w, "bad command", http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.commands++
	f.mu.Unlock()
	var b []byte
	for _, ev := range []api.Event{{Type: api.EventInit, Text: "p1"}, {Type: api.EventComplete}} {
		b = ev.AppendFrame(b)
	}
	w.Write(b)
}

func newTestBench(srv *server, set settings) *bench {
	return &bench{set: set, srv: srv, progress: io.Discard}
}

func TestPooledCreates(t *testing.T) {
	f, srv := newFake(t, false)
	b := newTestBench(srv, settings{creates: 6, poolBuffer: 2})
	rows, err := b.pooledCreates(t.Context())
	if err != nil {
		t.Fatalf("pooledCreates: %v", err)
	}
	r := rows[0]
	if r.Missing != "" || r.Value <= 0 || r.P99 < r.Value || r.Met == nil {
		t.Errorf("row %+v", r)
	}
	if f.pool != nil || len(f.sandboxes) != 0 || f.commands != 6 || f.emptyTake != 0 {
		t.Errorf("after the run: pool %v, %d sandboxes left, %d commands, %d creates from an empty pool", f.pool, len(f.sandboxes), f.commands, f.emptyTake)
	}
}

func TestConcurrentPooled(t *testing.T) {
	f, srv := newFake(t, false)
	b := newTestBench(srv, settings{concurrent: 25})
	rows, err := b.concurrentPooled(t.Context())
	if err != nil {
		t.Fatalf("concurrentPooled: %v", err)
	}
	r := rows[0]
	if r.Missing != "" || r.Value <= 0 || r.Met == nil || !strings.Contains(r.Note, "errors: 0 of 25") || !strings.Contains(r.Note, "pool buffer 25") {
		t.Errorf("row %+v", r)
	}
	if f.pool != nil || len(f.sandboxes) != 0 || f.commands != 25 || f.emptyTake != 0 {
		t.Errorf("after the run: pool %v, %d sandboxes left, %d commands, %d creates from an empty pool", f.pool, len(f.sandboxes), f.commands, f.emptyTake)
	}
}

func TestNoPools(t *testing.T) {
	_, srv := newFake(t, true)
	b := newTestBench(srv, settings{creates: 3, poolBuffer: 2, concurrent: 5})
	for name, run := range map[string]func() ([]row, error){
		"sequential": func() ([]row, error) { return b.pooledCreates(t.Context()) },
		"concurrent": func() ([]row, error) { return b.concurrentPooled(t.Context()) },
	} {
		rows, err := run()
		if !errors.Is(err, errNoPools) || len(rows) != 1 || rows[0].Name == "" {
			t.Errorf("%s: rows %+v, err %v; want one named row and errNoPools", name, rows, err)
		}
	}
}

func TestParentPID(t *testing.T) {
	got, err := parentPID(strconv.Itoa(os.Getpid()))
	if err != nil || got != strconv.Itoa(os.Getppid()) {
		t.Fatalf("parentPID(self) = %q, %v; want %d", got, err, os.Getppid())
	}
}

func TestProcFields(t *testing.T) {
	m, err := procFields(fmt.Sprintf("/proc/%d/status", os.Getpid()), "VmRSS", "RssAnon")
	if err != nil {
		testenv.Missing(t, "no /proc here: %v", err)
	}
	if m["VmRSS"] < m["RssAnon"] || m["RssAnon"] <= 0 {
		t.Fatalf("VmRSS %v, RssAnon %v", m["VmRSS"], m["RssAnon"])
	}
}
