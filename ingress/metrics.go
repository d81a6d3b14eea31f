package ingress

import (
	"bufio"
	"cmp"
	"io"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons of opensandbox_ingress_route_misses_total: why a request was
// not forwarded (or, for upstream, not answered by the sandbox).
const (
	missInvalidRoute = "invalid_route"
	missUnauthorized = "unauthorized"
	missNotFound     = "not_found"
	missNotRunning   = "not_running"
	missUnavailable  = "unavailable"
	missUpstream     = "upstream"
)

// metrics are the gateway's Prometheus collectors; they exist whether or
// not Config.Metrics registers them.
type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	bytesIn     prometheus.Counter
	bytesOut    prometheus.Counter
	activeReqs  prometheus.Gauge
	activeConns prometheus.Gauge
	misses      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "opensandbox_ingress_requests_total",
			Help: "Requests the gateway answered, by status class (1xx..5xx).",
		}, []string{"class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "opensandbox_ingress_request_duration_seconds",
			Help:    "Time from a request's arrival to the end of its answer (streams and WebSockets included), by status class.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"class"}),
		bytesIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "opensandbox_ingress_received_bytes_total",
			Help: "Body bytes received from clients (and from them on upgraded connections).",
		}),
		bytesOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "opensandbox_ingress_sent_bytes_total",
			Help: "Body bytes sent to clients (and to them on upgraded connections).",
		}),
		activeReqs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "opensandbox_ingress_active_requests",
			Help: "Requests in progress, open streams and WebSockets included.",
		}),
		activeConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "opensandbox_ingress_active_connections",
			Help: "Client connections open (when the server reports them through Gateway.ConnState).",
		}),
		misses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "opensandbox_ingress_route_misses_total",
			Help: "Requests not served by a sandbox, by reason: invalid_route, unauthorized, not_found, not_running, unavailable, upstream.",
		}, []string{"reason"}),
	}
	for _, r := range []string{missInvalidRoute, missUnauthorized, missNotFound, missNotRunning, missUnavailable, missUpstream} {
		m.misses.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.duration, m.bytesIn, m.bytesOut, m.activeReqs, m.activeConns, m.misses} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// statusClass is "2xx" for 200..299 and so on.
func statusClass(code int) string {
	switch {
	case code < 200:
		return "1xx"
	case code < 300:
		return "2xx"
	case code < 400:
		return "3xx"
	case code < 500:
		return "4xx"
	default:
		return "5xx"
	}
}

// respWriter counts what a handler writes and remembers its status.
// Flushes and hijacks pass through; a hijacked connection counts its
// traffic both ways, and without a status counts as 101.
type respWriter struct {
	http.ResponseWriter
	code int
	out  atomic.Int64
	in   *atomic.Int64
}

func (w *respWriter) WriteHeader(code int) {
	if w.code == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *respWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.out.Add(int64(n))
	return n, err
}

// Unwrap gives http.ResponseController the wrapped ResponseWriter.
func (w *respWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// FlushError flushes the wrapped ResponseWriter.
func (w *respWriter) FlushError() error {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack takes over the connection and counts what passes on it.
func (w *respWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	// The reverse proxy copies between this connection and the
	// sandbox's; brw only carries the 101 answer.
	return &countConn{Conn: conn, in: w.in, out: &w.out}, brw, nil
}

func (w *respWriter) status() int { return cmp.Or(w.code, http.StatusOK) }

// countConn counts the bytes of an upgraded connection.
type countConn struct {
	net.Conn
	in, out *atomic.Int64
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}

// countBody counts the bytes read from a request body.
type countBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}
