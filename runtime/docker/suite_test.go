package docker

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/opensandbox/opensandbox/runtime/runtimetest"
	"github.com/opensandbox/opensandbox/sandbox"
)

// The conformance suite's hooks: what it needs done behind the runtime's
// API, done on the engine and in the runtime's index.

// reopened holds the runtimes a Reopen closed, which their test's cleanup
// must not close again.
var reopened sync.Map

// newSuiteRuntime returns a runtime with its own label scope and data
// directory, removed with all it made when the test ends unless a Reopen
// took its place.
func newSuiteRuntime(t *testing.T) sandbox.Runtime {
	return openSuiteRuntime(t, Config{DataDir: t.TempDir(), ExecdPath: testExecd, LabelScope: testScope(), StartTimeout: startTimeout()})
}

func openSuiteRuntime(t *testing.T, cfg Config) *Runtime {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt, err := New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, gone := reopened.Load(rt); gone {
			return
		}
		rt.RemoveScope(context.Background())
		rt.Close()
	})
	return rt
}

var suiteHooks = runtimetest.Hooks{
	WarmLeft: func(t *testing.T, srt sandbox.Runtime, pool string) []sandbox.ID {
		rt := srt.(*Runtime)
		// A container counts as left behind when the index had no entry
		// for it before the engine was asked, nor after: entries are made
		// before their containers and dropped after them.
		before := knownIDs(rt)
		cs, err := rt.eng.list(context.Background(), labelPool+"="+pool)
		if err != nil {
			t.Fatal(err)
		}
		rt.mu.Lock()
		defer rt.mu.Unlock()
		var out []sandbox.ID
		for id, e := range rt.byID {
			if e.pool == pool && !e.deleting && !e.claiming {
				out = append(out, id)
			}
		}
		for _, c := range cs {
			id := sandbox.ID(c.Labels[labelID])
			if _, now := rt.byID[id]; c.Labels[labelScope] == rt.cfg.LabelScope && !before[id] && !now {
				out = append(out, id)
			}
		}
		return out
	},
	// The runtime no longer holds the token the sandbox's execd was
	// started with, as when its record is damaged: execd refuses the
	// hand-over with 401.
	BreakWarm: func(t *testing.T, srt sandbox.Runtime, id sandbox.ID) {
		rt := srt.(*Runtime)
		rt.mu.Lock()
		defer rt.mu.Unlock()
		e := rt.byID[id]
		if e == nil || e.pool == "" {
			t.Fatalf("sandbox %s is not a warm sandbox", id)
		}
		e.token = newToken()
	},
	Reopen: func(t *testing.T, srt sandbox.Runtime) sandbox.Runtime {
		rt := srt.(*Runtime)
		cfg := Config{DataDir: rt.cfg.DataDir, ExecdPath: testExecd, LabelScope: rt.cfg.LabelScope, StartTimeout: rt.cfg.StartTimeout}
		reopened.Store(rt, true)
		if err := rt.Close(); err != nil {
			t.Fatalf("close the runtime: %v", err)
		}
		return openSuiteRuntime(t, cfg)
	},
	Vanish: func(t *testing.T, srt sandbox.Runtime, id sandbox.ID) {
		rt := srt.(*Runtime)
		if err := rt.eng.remove(context.Background(), containerName(id)); err != nil {
			t.Fatalf("remove the container of %s: %v", id, err)
		}
	},
	Output: func(line string) []string {
		return []string{"sh", "-c", "echo " + line + "; exec sleep 1000000"}
	},
}

// knownIDs returns the ids r's index holds.
func knownIDs(r *Runtime) map[sandbox.ID]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[sandbox.ID]bool, len(r.byID))
	for id := range r.byID {
		out[id] = true
	}
	return out
}
