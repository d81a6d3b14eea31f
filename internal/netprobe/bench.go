package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// The bench commands measure instead of making one attempt. Each prints
// one JSON line, a benchResult, and fails (exit 1) at the first attempt
// that does not get through: a figure made of refused connections would
// mean nothing.
//
//	netprobe bench http URL -n N       N GETs, each on a new connection
//	netprobe bench dns NAME -n N       N queries (UDP, -server or resolv.conf's)
//	netprobe bench download URL        one GET of a large body, read to its end
//	netprobe bench hold URL -n N -for D
//	                                   N connections held open at once, each
//	                                   after one keep-alive GET; the line is
//	                                   printed once all are open, then they are
//	                                   held for D
//
// An HTTP URL's host is resolved once, before any timing, and every
// connection goes to that address with the URL's host as Host: the
// timings of bench http are a TCP connect and one small request, not a
// DNS lookup. The whole command is bounded by -timeout.

// benchResult is the line a bench command prints. Times are in
// microseconds.
type benchResult struct {
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// N is how many attempts were timed (connections, queries, or held
	// connections).
	N int `json:"n,omitempty"`
	// P50 and P99 are percentiles of Samples.
	P50 int64 `json:"p50_us,omitempty"`
	P99 int64 `json:"p99_us,omitempty"`
	// ConnectP50 and ConnectP99 are percentiles of the TCP connects
	// alone (bench http).
	ConnectP50 int64 `json:"connect_p50_us,omitempty"`
	ConnectP99 int64 `json:"connect_p99_us,omitempty"`
	// Samples are the timings of each attempt, in order (bench http and
	// dns), so that runs can be merged.
	Samples []int64 `json:"samples_us,omitempty"`
	// Bytes and Micros are the body read by bench download and how long
	// it took, from the connect to the last byte.
	Bytes  int64 `json:"bytes,omitempty"`
	Micros int64 `json:"micros,omitempty"`
}

// benchOptions are the flags of the bench commands beside the options
// they share with the other commands (-timeout, -server, -type).
type benchOptions struct {
	n    int
	hold time.Duration
}

// parseBench reads the arguments of a bench command, flags anywhere
// among them.
func parseBench(args []string) ([]string, options, benchOptions, error) {
	var o options
	var bo benchOptions
	fs := flag.NewFlagSet("netprobe bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.DurationVar(&o.timeout, "timeout", time.Minute, "bound of the whole command")
	fs.StringVar(&o.server, "server", "", "DNS server ADDR:PORT")
	fs.StringVar(&o.qtype, "type", "A", "DNS query type")
	fs.IntVar(&bo.n, "n", 100, "attempts")
	fs.DurationVar(&bo.hold, "for", 10*time.Second, "how long bench hold keeps its connections")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, o, bo, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, o, bo, nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}

// runBench runs the bench command of args (after "bench"). usage reports
// that args were not understood.
func runBench(ctx context.Context, args []string) (r benchResult, usage bool) {
	pos, o, bo, err := parseBench(args)
	if err != nil || len(pos) != 2 || bo.n < 1 {
		return benchResult{Detail: fmt.Sprintf("usage: netprobe bench http|dns|download|hold TARGET [-n N] [-for D] (%v, %q)", err, pos)}, true
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	switch pos[0] {
	case "http":
		r, err = benchHTTP(ctx, pos[1], bo.n)
	case "dns":
		r, err = benchDNS(ctx, pos[1], bo.n, o)
	case "download":
		r, err = benchDownload(ctx, pos[1])
	case "hold":
		r, err = benchHold(ctx, pos[1], bo.n, bo.hold)
	default:
		return benchResult{Detail: fmt.Sprintf("usage: netprobe bench: unknown measure %q", pos[0])}, true
	}
	if err != nil {
		r.OK, r.Detail = false, strings.TrimPrefix(r.Detail+": "+err.Error(), ": ")
		return r, false
	}
	r.OK = true
	return r, false
}

// target is where the requests of an HTTP URL go: the host resolved once,
// and the request line and Host to send.
type target struct {
	addr string // IP:PORT
	host string // the URL's host, for Host
	path string // with the query
}

func resolveTarget(ctx context.Context, rawURL string) (target, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" {
		return target{}, fmt.Errorf("URL %q: want http://HOST[:PORT]/PATH", rawURL)
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", u.Hostname())
	if err != nil {
		return target{}, fmt.Errorf("resolve %s: %w", u.Hostname(), err)
	}
	return target{addr: net.JoinHostPort(ips[0].String(), port), host: u.Host, path: u.RequestURI()}, nil
}

// request is a GET of t, closing the connection after it unless
// keepAlive.
func (t target) request(keepAlive bool) string {
	conn := "close"
	if keepAlive {
		conn = "keep-alive"
	}
	return "GET " + t.path + " HTTP/1.1\r\nHost: " + t.host + "\r\nUser-Agent: netprobe\r\nConnection: " + conn + "\r\n\r\n"
}

// get sends a GET on c and reads the response to its end into buf; it
// returns the body's length. A status other than 200 is an error.
func get(c net.Conn, br *bufio.Reader, req string, buf []byte) (int64, error) {
	if _, err := io.WriteString(c, req); err != nil {
		return 0, fmt.Errorf("send: %w", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, fmt.Errorf("read response: %w", err)
	}
	defer resp.Body.Close()
	var n int64
	for {
		k, err := resp.Body.Read(buf)
		n += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return n, fmt.Errorf("read body after %d bytes: %w", n, err)
		}
	}
	if resp.StatusCode != http.StatusOK {
		return n, fmt.Errorf("HTTP %s", resp.Status)
	}
	return n, nil
}

// benchHTTP times n GETs of rawURL, each on a new connection: from the
// start of the connect to the end of the response.
func benchHTTP(ctx context.Context, rawURL string, n int) (benchResult, error) {
	t, err := resolveTarget(ctx, rawURL)
	if err != nil {
		return benchResult{}, err
	}
	req := t.request(false)
	buf := make([]byte, 64<<10)
	var total, connect []time.Duration
	var d net.Dialer
	for i := range n {
		start := time.Now()
		c, err := d.DialContext(ctx, "tcp", t.addr)
		if err != nil {
			return benchResult{N: i}, fmt.Errorf("connection %d: %w", i+1, err)
		}
		connected := time.Now()
		if dl, ok := ctx.Deadline(); ok {
			c.SetDeadline(dl)
		}
		_, err = get(c, bufio.NewReader(c), req, buf)
		end := time.Now()
		c.Close()
		if err != nil {
			return benchResult{N: i}, fmt.Errorf("connection %d: %w", i+1, err)
		}
		total = append(total, end.Sub(start))
		connect = append(connect, connected.Sub(start))
	}
	r := timed(total)
	r.ConnectP50, r.ConnectP99 = percentile(connect, 0.5), percentile(connect, 0.99)
	r.Detail = fmt.Sprintf("%d GETs of %s at %s, a new connection each", n, rawURL, t.addr)
	return r, nil
}

// benchDNS times n A queries for name over UDP.
func benchDNS(ctx context.Context, name string, n int, o options) (benchResult, error) {
	server, err := nameServer(o)
	if err != nil {
		return benchResult{}, err
	}
	q, qtype, err := query(name, o)
	if err != nil {
		return benchResult{}, err
	}
	cl := &dns.Client{Net: "udp", Timeout: o.timeout}
	var took []time.Duration
	for i := range n {
		q.Id = dns.Id()
		start := time.Now()
		m, _, err := cl.ExchangeContext(ctx, q, server)
		d := time.Since(start)
		if err != nil {
			return benchResult{N: i}, fmt.Errorf("query %d: %w", i+1, err)
		}
		if detail, err := answered(m, qtype); err != nil {
			return benchResult{N: i, Detail: detail}, fmt.Errorf("query %d: %w", i+1, err)
		}
		took = append(took, d)
	}
	r := timed(took)
	r.Detail = fmt.Sprintf("%d queries for %s to %s", n, name, server)
	return r, nil
}

// nameServer is -server, or the first name server of resolv.conf.
func nameServer(o options) (string, error) {
	if o.server != "" {
		return o.server, nil
	}
	conf, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil {
		return "", fmt.Errorf("no -server and no resolv.conf: %w", err)
	}
	if len(conf.Servers) == 0 {
		return "", errors.New("no -server and no name server in resolv.conf")
	}
	return net.JoinHostPort(conf.Servers[0], conf.Port), nil
}

// benchDownload reads the body of one GET of rawURL to its end.
func benchDownload(ctx context.Context, rawURL string) (benchResult, error) {
	t, err := resolveTarget(ctx, rawURL)
	if err != nil {
		return benchResult{}, err
	}
	start := time.Now()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return benchResult{}, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	n, err := get(c, bufio.NewReaderSize(c, 64<<10), t.request(false), make([]byte, 1<<20))
	took := time.Since(start)
	if err != nil {
		return benchResult{Bytes: n}, err
	}
	return benchResult{N: 1, Bytes: n, Micros: took.Microseconds(),
		Detail: fmt.Sprintf("%d bytes in %v: %.0f MB/s", n, took.Round(time.Millisecond), float64(n)/took.Seconds()/1e6)}, nil
}

// benchHold opens n connections to rawURL, 32 at a time, each carrying
// one keep-alive GET, and once all are open prints the result line and
// keeps them open for hold (or until ctx ends).
func benchHold(ctx context.Context, rawURL string, n int, hold time.Duration) (benchResult, error) {
	t, err := resolveTarget(ctx, rawURL)
	if err != nil {
		return benchResult{}, err
	}
	req := t.request(true)
	conns := make([]net.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	errs := make([]error, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", t.addr)
			if err != nil {
				errs[i] = err
				return
			}
			conns[i] = c
			c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := get(c, bufio.NewReader(c), req, make([]byte, 4096)); err != nil {
				errs[i] = err
				return
			}
			c.SetDeadline(time.Time{})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		failed := len(slices.DeleteFunc(errs, func(e error) bool { return e == nil }))
		return benchResult{N: n - failed}, fmt.Errorf("%d of %d connections failed: %w", failed, n, firstErr(errs))
	}
	r := benchResult{OK: true, N: n, Micros: time.Since(start).Microseconds(),
		Detail: fmt.Sprintf("%d connections to %s open, held for %v", n, t.addr, hold)}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return r, err
	}
	select {
	case <-time.After(hold):
	case <-ctx.Done():
	}
	r.Detail = fmt.Sprintf("%d connections to %s held for %v, closed", n, t.addr, hold)
	return r, nil
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// timed is the result of the timings ds.
func timed(ds []time.Duration) benchResult {
	r := benchResult{N: len(ds), P50: percentile(ds, 0.5), P99: percentile(ds, 0.99)}
	for _, d := range ds {
		r.Samples = append(r.Samples, d.Microseconds())
	}
	return r
}

// percentile is the p-th (0..1) percentile of ds in microseconds, the
// nearest rank at or below.
func percentile(ds []time.Duration, p float64) int64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)].Microseconds()
}
