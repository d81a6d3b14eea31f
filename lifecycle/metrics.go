package lifecycle

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/opensandbox/opensandbox/sandbox"
)

var _ sandbox.Observer = (*Metrics)(nil)

// Metrics is the lifecycle server's Prometheus registry, served at
// GET /metrics: the Go and process collectors, request latency by route,
// and what the runtime, its pools and the manager report through the
// sandbox.Observer that Metrics implements. It is private to the server,
// never prometheus.DefaultRegisterer. Create it before the runtime, hand
// it to the runtime and the manager as their Observer, and to New in
// Config.Metrics; one Metrics serves one Server. docs/metrics.md lists
// every series.
type Metrics struct {
	reg        *prometheus.Registry
	httpDur    *prometheus.HistogramVec
	createDur  *prometheus.HistogramVec
	pullDur    *prometheus.HistogramVec
	reconDur   *prometheus.HistogramVec
	poolClaims *prometheus.CounterVec
}

// NewMetrics returns a registry with the Go and process collectors and
// the server's own series, those with a fixed set of labels already at
// zero so that dashboards see them before the first event.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		httpDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "opensandbox_http_request_duration_seconds",
			Help:    "Time from a lifecycle API request's arrival to its handler's return (for streams and the proxy: the whole stream), by route pattern, method and status code.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route", "method", "code"}),
		createDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "opensandbox_sandbox_create_duration_seconds",
			Help:    "Time from a create request to the sandbox being Running (execd answers), by mode: cold (made from its image) or pooled (claimed from a warm pool).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"mode"}),
		pullDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "opensandbox_image_pull_duration_seconds",
			Help:    "Time of one image pull (concurrent requests for an image share one pull), by result: success, error, or canceled when every waiting create gave up.",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"result"}),
		reconDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "opensandbox_reconcile_duration_seconds",
			Help:    "Time of one housekeeping pass, by loop (runtime: the runtime's reconciliation; expiry: the sweep deleting expired sandboxes) and result (success, error).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"loop", "result"}),
		poolClaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "opensandbox_pool_claims_total",
			Help: "Creates that asked for a warm pool, by pool and result: hit (got a pre-started sandbox) or miss (started one cold).",
		}, []string{"pool", "result"}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.httpDur, m.createDur, m.pullDur, m.reconDur, m.poolClaims,
	)
	for _, mode := range []sandbox.CreateMode{sandbox.CreateCold, sandbox.CreatePooled} {
		m.createDur.WithLabelValues(string(mode))
	}
	for _, result := range []string{resultSuccess, resultError, resultCanceled} {
		m.pullDur.WithLabelValues(result)
	}
	for _, loop := range []string{sandbox.LoopRuntime, sandbox.LoopExpiry} {
		for _, result := range []string{resultSuccess, resultError} {
			m.reconDur.WithLabelValues(loop, result)
		}
	}
	return m
}

// Values of the result label.
const (
	resultSuccess  = "success"
	resultError    = "error"
	resultCanceled = "canceled"
	resultHit      = "hit"
	resultMiss     = "miss"
)

// Registry returns the registry, for collectors of other components.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// SandboxReady observes a create's latency for its mode.
func (m *Metrics) SandboxReady(mode sandbox.CreateMode, d time.Duration) {
	m.createDur.WithLabelValues(string(mode)).Observe(d.Seconds())
}

// ImagePulled observes a pull's duration by result; the image is not a
// label, since there is no bound to the images asked for.
func (m *Metrics) ImagePulled(image string, d time.Duration, err error) {
	result := resultSuccess
	switch {
	case errors.Is(err, context.Canceled):
		result = resultCanceled
	case err != nil:
		result = resultError
	}
	m.pullDur.WithLabelValues(result).Observe(d.Seconds())
}

// Reconciled observes a housekeeping pass by loop and result.
func (m *Metrics) Reconciled(loop string, d time.Duration, err error) {
	result := resultSuccess
	if err != nil {
		result = resultError
	}
	m.reconDur.WithLabelValues(loop, result).Observe(d.Seconds())
}

// PoolClaim counts a claim on a pool as a hit or a miss. pool must be
// the name of a configured pool, so that the label stays bounded.
func (m *Metrics) PoolClaim(pool string, hit bool) {
	result := resultMiss
	if hit {
		result = resultHit
	}
	m.poolClaims.WithLabelValues(pool, result).Inc()
}

// attach registers the collectors that read the server's runtime at
// scrape time, and returns the handler of GET /metrics. It fails when
// the Metrics already serves another server.
func (m *Metrics) attach(rt sandbox.Runtime, version string, log *slog.Logger) (http.Handler, error) {
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "opensandbox_build_info",
		Help:        "Always 1; the version label is the server's version.",
		ConstLabels: prometheus.Labels{"version": cmp.Or(version, "unknown")},
	})
	info.Set(1)
	cs := []prometheus.Collector{info, &sandboxCollector{rt: rt}}
	if pl, ok := rt.(sandbox.PoolLister); ok {
		cs = append(cs, &poolCollector{pools: pl})
	}
	for _, c := range cs {
		if err := m.reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics (a Metrics serves one server): %w", err)
		}
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError),
		// A runtime that cannot list costs its own series, not the scrape.
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      m.reg,
	}), nil
}

// observeRequest observes one API request.
func (m *Metrics) observeRequest(route, method string, code int, d time.Duration) {
	m.httpDur.WithLabelValues(route, methodLabel(method), strconv.Itoa(code)).Observe(d.Seconds())
}

// collectTimeout bounds what a collector may wait for the runtime.
// Runtimes serve List and Pools from memory, so it is only met by one
// that is stuck.
const collectTimeout = 2 * time.Second

// sandboxCollector reports how many sandboxes are in each state, read
// from the runtime's List at every scrape.
type sandboxCollector struct {
	rt sandbox.Runtime
}

var sandboxesDesc = prometheus.NewDesc("opensandbox_sandboxes",
	"Sandboxes by state, as the runtime lists them at scrape time.", []string{"state"}, nil)

// knownStates are reported even when no sandbox is in them.
var knownStates = []sandbox.State{
	sandbox.StatePending, sandbox.StateRunning, sandbox.StatePausing, sandbox.StatePaused, sandbox.StateResuming,
	sandbox.StateStopping, sandbox.StateTerminated, sandbox.StateFailed, sandbox.StateUnknown,
}

// Describe sends the collector's one descriptor.
func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sandboxesDesc }

// Collect counts the runtime's sandboxes by state; every known state is
// reported, at zero when empty.
func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	all, err := c.rt.List(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(sandboxesDesc, fmt.Errorf("list sandboxes: %w", err))
		return
	}
	counts := make(map[sandbox.State]int, len(knownStates))
	for _, st := range knownStates {
		counts[st] = 0
	}
	for _, sb := range all {
		counts[sb.Status.State]++
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), string(st))
	}
}

// poolCollector reports the size of every warm pool at scrape time.
type poolCollector struct {
	pools sandbox.PoolLister
}

var poolSandboxesDesc = prometheus.NewDesc("opensandbox_pool_sandboxes",
	"Sandboxes of each warm pool by state: available (ready to claim), allocated (claimed), starting (neither yet).",
	[]string{"pool", "state"}, nil)

// Describe sends the collector's one descriptor.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) { ch <- poolSandboxesDesc }

// Collect reports available, allocated and starting sandboxes of every
// pool; starting is what the total holds beyond the other two.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	pools, err := c.pools.Pools(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(poolSandboxesDesc, fmt.Errorf("list pools: %w", err))
		return
	}
	for _, p := range pools {
		starting := max(p.Total-p.Allocated-p.Available, 0)
		for state, n := range map[string]int{"available": p.Available, "allocated": p.Allocated, "starting": starting} {
			ch <- prometheus.MustNewConstMetric(poolSandboxesDesc, prometheus.GaugeValue, float64(n), p.Name, state)
		}
	}
}

// routeLabel turns the mux pattern that matched a request ("GET
// /v1/sandboxes/{id}") into its route label ("/sandboxes/{id}"): the
// pattern's path, without method or /v1. The catch-all "/" is "other".
func routeLabel(pattern string) string {
	if _, path, ok := strings.Cut(pattern, " "); ok {
		pattern = path
	}
	pattern = strings.TrimPrefix(pattern, "/v1")
	if pattern == "" || pattern == "/" {
		return routeOther
	}
	return pattern
}

// Route labels that are not mux patterns.
const (
	// routeOther is every request no route matched.
	routeOther = "other"
	// routeProxy is the proxy route, which serve dispatches before the
	// mux.
	routeProxy = "/sandboxes/{id}/proxy/{port}"
)

// methodLabel returns method if it is a standard HTTP method, else
// "other": the label must not grow with what clients make up.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "other"
}

// statusWriter remembers the status code of a response. Flushes and
// hijacks pass through to the ResponseWriter it wraps; a hijacked
// connection that sent no status counts as 101 Switching Protocols.
type statusWriter struct {
	http.ResponseWriter
	code int
}

// WriteHeader records the first final status code.
func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write records the implicit 200 of a body written without a status.
func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap gives http.ResponseController the wrapped ResponseWriter.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// FlushError flushes the wrapped ResponseWriter.
func (w *statusWriter) FlushError() error {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack takes over the connection of the wrapped ResponseWriter.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	return conn, brw, err
}

// status returns the recorded status: 200 when the handler wrote
// nothing, as net/http then sends.
func (w *statusWriter) status() int { return cmp.Or(w.code, http.StatusOK) }
