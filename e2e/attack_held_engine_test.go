package e2e

import (
	"bytes"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
)

// engineGate stands between a server and the real engine socket, and can
// freeze it: while frozen, no byte passes either way and new connections
// wait, as if the engine had stopped (SIGSTOP) without closing anything.
// It can also hold just the requests that create containers. The engine
// itself is never touched; other users of it see nothing.
type engineGate struct {
	path        string // the socket the server is given
	mu          sync.Mutex
	cond        *sync.Cond
	frozen      bool
	holdCreates bool
	held        int // container creates waiting at the gate
}

// newEngineGate listens on a socket in a test directory and forwards to
// the engine's socket until the test ends.
func newEngineGate(t *testing.T, engineSocket string) *engineGate {
	t.Helper()
	g := &engineGate{path: filepath.Join(t.TempDir(), "engine.sock")}
	g.cond = sync.NewCond(&g.mu)
	ln, err := net.Listen("unix", g.path)
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		g.set(false)
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				g.wait()
				e, err := net.Dial("unix", engineSocket)
				if err != nil {
					return
				}
				defer e.Close()
				done := make(chan struct{}, 2)
				go func() { g.copy(e, c, true); done <- struct{}{} }()
				go func() { g.copy(c, e, false); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return g
}

// set freezes or thaws the engine.
func (g *engineGate) set(frozen bool) {
	g.mu.Lock()
	g.frozen = frozen
	g.mu.Unlock()
	g.cond.Broadcast()
}

func (g *engineGate) wait() {
	g.mu.Lock()
	for g.frozen {
		g.cond.Wait()
	}
	g.mu.Unlock()
}

// hold sets whether requests that create a container wait at the gate.
func (g *engineGate) hold(on bool) {
	g.mu.Lock()
	g.holdCreates = on
	g.mu.Unlock()
	g.cond.Broadcast()
}

// heldCreates returns how many container creates wait at the gate.
func (g *engineGate) heldCreates() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// waitCreate holds a container create while the gate says so.
func (g *engineGate) waitCreate() {
	g.mu.Lock()
	g.held++
	for g.holdCreates {
		g.cond.Wait()
	}
	g.held--
	g.mu.Unlock()
}

// copy forwards src to dst, holding each chunk while the gate is frozen,
// and a request (toEngine) that creates a container while creates are
// held.
func (g *engineGate) copy(dst io.Writer, src io.Reader, toEngine bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if toEngine && bytes.HasPrefix(buf[:n], []byte("POST ")) && bytes.Contains(buf[:n], []byte("/containers/create")) {
				g.waitCreate()
			}
			g.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
