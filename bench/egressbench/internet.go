package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/standin"
)

// The names of the local internet. Every one of them answers with the
// web server's address.
const (
	webName  = "web.bench.test"  // allowed by every policy of the harness
	flipName = "flip.bench.test" // its rule flips between allow and deny in the update measure
)

// internet is the harness's small internet: a network namespace (made by
// standin) holding two addresses of 203.0.113.0/24, routed from the host
// and nowhere else; a name server authoritative for names under
// bench.test on one, and a web server on the other. Sandboxes reach them
// through the host, as they would reach the real internet; no packet
// leaves the machine.
type internet struct {
	tb     *harnessTB
	web    netip.Addr // the web server, port 80
	dns    netip.Addr // the name server, port 53
	server *http.Server
}

// block is the body the web server sends, repeated: random bytes, so that
// nothing on the way can compress them.
var block = func() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}()

// newInternet builds the internet; close removes it.
func newInternet() (_ *internet, retErr error) {
	tb := newHarnessTB()
	defer func() {
		if retErr != nil {
			tb.cleanup()
		}
	}()
	var in *internet
	err := tb.run(func() {
		in = &internet{tb: tb}
		pick := func(prefix string) netip.Addr {
			return standin.Pick(tb, netip.MustParsePrefix(prefix), byte(2+rand.IntN(250)))
		}
		sn := standin.New(tb, pick("198.51.100.0/24"), netip.Addr{})
		in.web, in.dns = pick("203.0.113.0/24"), pick("203.0.113.0/24")
		if in.web == in.dns {
			tb.Fatalf("picked %s twice", in.web)
		}
		sn.Add(in.web)
		sn.Add(in.dns)
		sn.ServeDNS(in.dns, map[string]netip.Addr{webName: in.web, flipName: in.web})
		ln := sn.Listen(netip.AddrPortFrom(in.web, 80))
		in.server = &http.Server{Handler: http.HandlerFunc(serveWeb), ReadHeaderTimeout: time.Minute, IdleTimeout: 2 * time.Minute,
			ErrorLog: log.New(io.Discard, "", 0)}
		go in.server.Serve(ln)
		tb.Cleanup(func() { in.server.Close() })
	})
	if err != nil {
		return nil, fmt.Errorf("the local internet: %w", err)
	}
	return in, nil
}

// serveWeb answers /small with a few bytes and /bytes?n=N with N bytes.
func serveWeb(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/small":
		io.WriteString(w, "ok\n")
	case "/bytes":
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "n: want a byte count", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		w.Header().Set("Content-Type", "application/octet-stream")
		for n > 0 {
			k := min(n, int64(len(block)))
			if _, err := w.Write(block[:k]); err != nil {
				return
			}
			n -= k
		}
	default:
		http.NotFound(w, r)
	}
}

// close removes the namespace and stops the servers.
func (in *internet) close() { in.tb.cleanup() }

// harnessTB lets the harness use standin, whose functions take a
// testing.TB: Fatalf and Skipf (a missing dependency) end the function
// given to run with an error; Cleanup stacks functions for cleanup;
// TempDir makes a directory that cleanup removes. The embedded TB is nil:
// standin calls none of its other methods.
type harnessTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
}

func newHarnessTB() *harnessTB { return &harnessTB{} }

// fatal is what Fatalf panics with, for run to recover.
type fatal struct{ msg string }

// run calls f and returns the message of a Fatalf or Skipf it made.
func (t *harnessTB) run(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			ft, ok := r.(fatal)
			if !ok {
				panic(r)
			}
			err = errors.New(ft.msg)
		}
	}()
	f()
	return nil
}

func (t *harnessTB) Helper() {}

func (t *harnessTB) Fatalf(format string, args ...any) { panic(fatal{fmt.Sprintf(format, args...)}) }

func (t *harnessTB) Fatal(args ...any) { panic(fatal{fmt.Sprint(args...)}) }

func (t *harnessTB) Skipf(format string, args ...any) { panic(fatal{fmt.Sprintf(format, args...)}) }

func (t *harnessTB) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "egressbench: "+format+"\n", args...)
}

func (t *harnessTB) Cleanup(f func()) {
	t.mu.Lock()
	t.cleanups = append(t.cleanups, f)
	t.mu.Unlock()
}

func (t *harnessTB) TempDir() string {
	dir, err := os.MkdirTemp("", "egressbench-")
	if err != nil {
		t.Fatalf("temporary directory: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// cleanup runs the cleanups, the last one first.
func (t *harnessTB) cleanup() {
	t.mu.Lock()
	fs := slices.Clone(t.cleanups)
	t.cleanups = nil
	t.mu.Unlock()
	for _, f := range slices.Backward(fs) {
		f()
	}
}
