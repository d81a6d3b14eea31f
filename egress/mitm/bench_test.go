package mitm

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"
)

// benchBody is a small JSON answer, about what a model API's error or a
// short completion is.
const benchBody = `{"id":"cmpl-1","object":"text_completion","choices":[{"text":"hello","index":0}]}`

// benchUpstream starts a provider that answers benchBody to requests
// that carry a key. It keeps nothing per request.
func benchUpstream(b *testing.B, h2 bool) (*upstreamCA, string) {
	uca := newUpstreamCA(b)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, benchBody)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{uca.leaf(b, providerName)}, NextProtos: []string{"http/1.1"}}
	if h2 {
		srv.TLS.NextProtos = []string{"h2", "http/1.1"}
		srv.EnableHTTP2 = true
	}
	srv.StartTLS()
	b.Cleanup(srv.Close)
	return uca, srv.Listener.Addr().String()
}

// runRequests sends GETs through c and reports the median latency.
func runRequests(b *testing.B, c *http.Client, url string, hdr http.Header) {
	b.Helper()
	b.ReportAllocs()
	var lat []time.Duration
	for b.Loop() {
		req, _ := http.NewRequest("GET", url, nil)
		for k, v := range hdr {
			req.Header[k] = v
		}
		start := time.Now()
		res, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		lat = append(lat, time.Since(start))
		if err != nil || res.StatusCode != http.StatusOK || len(body) != len(benchBody) {
			b.Fatalf("status %d, %d bytes, %v", res.StatusCode, len(body), err)
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	}
}

// BenchmarkInjectKeepAlive is a request through the interceptor on a
// kept-alive client connection, injected and with its body redacted.
func BenchmarkInjectKeepAlive(b *testing.B) {
	for _, h2 := range []bool{false, true} {
		name := map[bool]string{false: "h1", true: "h2"}[h2]
		b.Run(name, func(b *testing.B) {
			uca, up := benchUpstream(b, h2)
			h := newHarness(b, uca.pool, map[string]string{providerName: up})
			runRequests(b, h.client(b, h2), "https://"+providerName+"/v1/models", nil)
		})
	}
}

// BenchmarkInjectNewConn is the same with a new client connection (and
// TLS handshake with the interceptor) per request; the upstream
// connection stays pooled.
func BenchmarkInjectNewConn(b *testing.B) {
	uca, up := benchUpstream(b, false)
	h := newHarness(b, uca.pool, map[string]string{providerName: up})
	c := h.client(b, false)
	c.Transport.(*http.Transport).DisableKeepAlives = true
	h.ic.cfg.CA.Leaf(providerName) // as after the first connection
	runRequests(b, c, "https://"+providerName+"/v1/models", nil)
}

// BenchmarkPassThrough is the baseline: the same requests straight to
// the upstream, no interception.
func BenchmarkPassThrough(b *testing.B) {
	for _, keepAlive := range []bool{true, false} {
		name := map[bool]string{true: "keepalive", false: "newconn"}[keepAlive]
		b.Run(name, func(b *testing.B) {
			uca, up := benchUpstream(b, false)
			tr := &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "tcp", up)
				},
				TLSClientConfig:   &tls.Config{RootCAs: uca.pool},
				DisableKeepAlives: !keepAlive,
			}
			b.Cleanup(tr.CloseIdleConnections)
			c := &http.Client{Transport: tr}
			runRequests(b, c, "https://"+providerName+"/v1/models", http.Header{"Authorization": {"Bearer " + secretKey}})
		})
	}
}
