package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// TestBenchLoopback runs every bench command against servers on
// loopback: the figures come back, and a refusal is a failure, not a
// figure.
func TestBenchLoopback(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bytes" {
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			w.Header().Set("Content-Length", strconv.Itoa(n))
			w.Write(make([]byte, n))
			return
		}
		if r.URL.Path != "/small" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("ok\n"))
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	r, usage := runBench(context.Background(), []string{"http", srv.URL + "/small", "-n", "20"})
	if usage || !r.OK || r.N != 20 || len(r.Samples) != 20 || r.P50 <= 0 || r.P99 < r.P50 || r.ConnectP50 <= 0 {
		t.Fatalf("bench http: %+v (usage %v)", r, usage)
	}
	if got := conns.Load(); got != 20 {
		t.Errorf("bench http made %d connections, want one per GET (20)", got)
	}

	r, _ = runBench(context.Background(), []string{"download", srv.URL + "/bytes?n=3000000"})
	if !r.OK || r.Bytes != 3_000_000 || r.Micros <= 0 {
		t.Fatalf("bench download: %+v", r)
	}

	before := conns.Load()
	r, _ = runBench(context.Background(), []string{"hold", srv.URL + "/small", "-n", "50", "-for", "10ms"})
	if !r.OK || r.N != 50 || !strings.Contains(r.Detail, "closed") {
		t.Fatalf("bench hold: %+v", r)
	}
	if got := conns.Load() - before; got != 50 {
		t.Errorf("bench hold opened %d connections, want 50", got)
	}

	r, _ = runBench(context.Background(), []string{"http", srv.URL + "/missing", "-n", "3"})
	if r.OK || !strings.Contains(r.Detail, "404") {
		t.Errorf("bench http of a 404: %+v; want a failure naming the status", r)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String() + "/"
	ln.Close()
	r, _ = runBench(context.Background(), []string{"http", refused, "-n", "3", "-timeout", "5s"})
	if r.OK {
		t.Errorf("bench http to a closed port: %+v; want a failure", r)
	}

	for _, args := range [][]string{nil, {"http"}, {"teleport", "x"}, {"http", srv.URL, "-n", "0"}} {
		if r, usage := runBench(context.Background(), args); !usage || r.OK {
			t.Errorf("runBench(%q) = %+v, usage %v; want a usage error", args, r, usage)
		}
	}
}

func TestBenchDNS(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := dns.NewServeMux()
	mux.HandleFunc("a.test.", func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		rr, _ := dns.NewRR("a.test. 5 IN A 203.0.113.1")
		m.Answer = append(m.Answer, rr)
		w.WriteMsg(m)
	})
	mux.HandleFunc(".", func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeNameError)
		w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	go srv.ActivateAndServe()
	defer srv.Shutdown()
	addr := pc.LocalAddr().String()

	r, _ := runBench(context.Background(), []string{"dns", "a.test", "-n", "30", "-server", addr})
	if !r.OK || r.N != 30 || len(r.Samples) != 30 || r.P50 <= 0 {
		t.Fatalf("bench dns: %+v", r)
	}
	r, _ = runBench(context.Background(), []string{"dns", "b.test", "-n", "3", "-server", addr, "-timeout", "5s"})
	if r.OK || !strings.Contains(r.Detail, "NXDOMAIN") {
		t.Errorf("bench dns of an unknown name: %+v; want a failure naming NXDOMAIN", r)
	}
}
