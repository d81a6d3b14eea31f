package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/sandbox"
)

// newMetricsEnv serves the API over rt with one Metrics that the server
// serves and rt reports to, as cmd/opensandbox-server wires them.
func newMetricsEnv(t *testing.T, rt *fake.Runtime, opts ...func(*Config)) (*testEnv, *Metrics) {
	m := NewMetrics()
	rt.Observer = m
	return newEnvWith(t, rt, append(opts, func(c *Config) { c.Metrics = m })...), m
}

// scrape fetches /metrics with the API key and parses it.
func (e *testEnv) scrape() map[string]*dto.MetricFamily {
	e.t.Helper()
	r := e.call("GET", "/metrics", "").wantStatus(e.t, http.StatusOK)
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		e.t.Errorf("/metrics Content-Type %q", ct)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		e.t.Fatalf("parse /metrics: %v\n%s", err, r.body)
	}
	return fams
}

// series returns the series of family name whose labels include want.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range fams[name].GetMetric() {
		n := 0
		for _, lp := range m.GetLabel() {
			if v, ok := want[lp.GetName()]; ok && v == lp.GetValue() {
				n++
			}
		}
		if n == len(want) {
			out = append(out, m)
		}
	}
	return out
}

// one returns the single series of name with labels want, failing when
// there is not exactly one.
func one(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	s := series(fams, name, want)
	if len(s) != 1 {
		t.Fatalf("%s%v: %d series, want 1", name, want, len(s))
	}
	return s[0]
}

// labelValues returns every value of label in family name.
func labelValues(fams map[string]*dto.MetricFamily, name, label string) []string {
	var out []string
	for _, m := range fams[name].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label && !slices.Contains(out, lp.GetValue()) {
				out = append(out, lp.GetValue())
			}
		}
	}
	slices.Sort(out)
	return out
}

// routePatternRE matches a route pattern: static segments and
// {wildcards}, never an id.
var routePatternRE = regexp.MustCompile(`^(/([a-z-]+|\{[a-z]+\}))+$`)

// histogramOf returns the histogram of vec with labels.
func histogramOf(t *testing.T, vec *prometheus.HistogramVec, labels ...string) *dto.Histogram {
	t.Helper()
	var pb dto.Metric
	if err := vec.WithLabelValues(labels...).(prometheus.Metric).Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetHistogram()
}

func TestMetricsRequestsAndSandboxes(t *testing.T) {
	rt := fake.New()
	rt.StartDelay = time.Millisecond
	e, _ := newMetricsEnv(t, rt, func(c *Config) { c.Version = "1.2.3" })

	id := e.create("")
	e.waitState(id, sandbox.StateRunning)
	e.call("GET", "/v1/sandboxes/"+id, "").wantStatus(t, 200)
	e.call("GET", "/sandboxes/"+id, "").wantStatus(t, 200)
	e.call("GET", "/v1/sandboxes/no-such-sandbox", "").wantStatus(t, 404)
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080", "").wantStatus(t, 200)
	e.call("DELETE", "/v1/sandboxes/"+id+"/endpoints/8080", "").wantStatus(t, 405)
	e.call("GET", "/v1/no/such/route/"+id, "").wantStatus(t, 404)
	e.call("BREW", "/v1/sandboxes", "").wantStatus(t, 405)
	e.call("GET", "/v1/sandboxes", "", api.HeaderAPIKey, "").wantStatus(t, 401)
	e.call("GET", "/v1/sandboxes/"+id+"/proxy/notaport/x", "").wantStatus(t, 400)
	e.call("GET", "/health", "", api.HeaderAPIKey, "").wantStatus(t, 200)
	rt.MissingImages["missing:1"] = true
	e.waitState(e.create(strings.Replace(validCreate, "python:3.11", "missing:1", 1)), sandbox.StateFailed)
	rt.StartDelay = time.Hour
	e.create("") // stays Pending

	fams := e.scrape()
	const hist = "opensandbox_http_request_duration_seconds"
	for _, c := range []struct {
		route, method, code string
		count               uint64
	}{
		{"/sandboxes", "POST", "202", 3},
		{"/sandboxes/{id}", "GET", "200", 2},
		{"/sandboxes/{id}", "GET", "404", 1},
		{"/sandboxes/{id}/endpoints/{port}", "GET", "200", 1},
		{"/sandboxes/{id}/endpoints/{port}", "DELETE", "405", 1},
		{"other", "GET", "404", 1},
		{"/sandboxes", "other", "405", 1},
		{"/sandboxes", "GET", "401", 1},
		{routeProxy, "GET", "400", 1},
		{"/health", "GET", "200", 1},
	} {
		h := one(t, fams, hist, map[string]string{"route": c.route, "method": c.method, "code": c.code}).GetHistogram()
		if h.GetSampleCount() != c.count || h.GetSampleSum() <= 0 || h.GetSampleSum() > 10 {
			t.Errorf("%s{route=%q,method=%q,code=%q}: count %d sum %g, want count %d and a sane sum",
				hist, c.route, c.method, c.code, h.GetSampleCount(), h.GetSampleSum(), c.count)
		}
	}
	// Route labels are patterns, never paths: no id, nothing unknown.
	for _, r := range labelValues(fams, hist, "route") {
		if r != routeOther && !routePatternRE.MatchString(r) || strings.HasPrefix(r, "/v1/") {
			t.Errorf("route label %q is not a pattern of the route table", r)
		}
	}
	if got := labelValues(fams, hist, "method"); !slices.Equal(got, []string{"DELETE", "GET", "POST", "other"}) {
		t.Errorf("method labels %v", got)
	}

	// Sandboxes by state, every state reported.
	for state, want := range map[sandbox.State]float64{sandbox.StateRunning: 1, sandbox.StatePending: 1, sandbox.StatePaused: 0, sandbox.StateFailed: 1, sandbox.StateTerminated: 0} {
		if got := one(t, fams, "opensandbox_sandboxes", map[string]string{"state": string(state)}).GetGauge().GetValue(); got != want {
			t.Errorf("opensandbox_sandboxes{state=%q} = %g, want %g", state, got, want)
		}
	}
	// The fake reported the first sandbox's cold create; no pooled ones.
	cold := one(t, fams, "opensandbox_sandbox_create_duration_seconds", map[string]string{"mode": "cold"}).GetHistogram()
	if cold.GetSampleCount() != 1 || cold.GetSampleSum() <= 0 || cold.GetSampleSum() > 5 {
		t.Errorf("cold creates: count %d sum %g, want 1 observation", cold.GetSampleCount(), cold.GetSampleSum())
	}
	if n := one(t, fams, "opensandbox_sandbox_create_duration_seconds", map[string]string{"mode": "pooled"}).GetHistogram().GetSampleCount(); n != 0 {
		t.Errorf("pooled creates: %d", n)
	}
	if v := one(t, fams, "opensandbox_build_info", map[string]string{"version": "1.2.3"}).GetGauge().GetValue(); v != 1 {
		t.Errorf("opensandbox_build_info = %g", v)
	}
	for _, name := range []string{"go_goroutines", "process_start_time_seconds", "opensandbox_image_pull_duration_seconds", "opensandbox_reconcile_duration_seconds"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	// The fake has no pools: no pool series.
	if fams["opensandbox_pool_sandboxes"] != nil {
		t.Errorf("pool series from a runtime without pools")
	}
}

func TestMetricsProxy(t *testing.T) {
	echo := echoBackend(t)
	ws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		conn.Close(websocket.StatusNormalClosure, "")
	}))
	defer ws.Close()
	rt := newRouted(hostOf(echo))
	rt.route(9000, hostOf(ws))
	m := NewMetrics()
	rt.Observer = m
	e := newEnvWith(t, rt, func(c *Config) { c.Metrics = m })
	id := e.create("")
	e.waitState(id, sandbox.StateRunning)

	e.call("POST", "/v1/sandboxes/"+id+"/proxy/8080/some/app/path?x=1", "body").wantStatus(t, 201)
	e.call("GET", "/sandboxes/"+id+"/proxy/8080", "").wantStatus(t, 201)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.url, "http")+"/v1/sandboxes/"+id+"/proxy/9000/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{api.HeaderAPIKey: {testKey}}})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	conn.Read(ctx) // until the backend closes
	conn.CloseNow()

	const hist = "opensandbox_http_request_duration_seconds"
	var fams map[string]*dto.MetricFamily
	// The upgraded request is observed when its handler returns, after
	// the client saw the close.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		fams = e.scrape()
		if len(series(fams, hist, map[string]string{"route": routeProxy, "code": "101"})) == 1 || time.Now().After(deadline) {
			break
		}
	}
	for _, c := range []struct {
		method, code string
		count        uint64
	}{{"POST", "201", 1}, {"GET", "201", 1}, {"GET", "101", 1}} {
		h := one(t, fams, hist, map[string]string{"route": routeProxy, "method": c.method, "code": c.code}).GetHistogram()
		if h.GetSampleCount() != c.count {
			t.Errorf("proxy %s %s: count %d, want %d", c.method, c.code, h.GetSampleCount(), c.count)
		}
	}
	// Scrapes before the last one show up as /metrics.
	got := slices.DeleteFunc(labelValues(fams, hist, "route"), func(r string) bool { return r == "/metrics" })
	if !slices.Equal(got, []string{"/sandboxes", routeProxy}) {
		t.Errorf("route labels %v, want the create and the proxy route", got)
	}
}

func TestMetricsAuth(t *testing.T) {
	cases := []struct {
		name     string
		public   bool
		insecure bool
		headers  []string
		status   int
		code     string
	}{
		{name: "no credentials", headers: []string{api.HeaderAPIKey, ""}, status: 401, code: codeMissingAPIKey},
		{name: "wrong key", headers: []string{api.HeaderAPIKey, "wrong"}, status: 401, code: codeInvalidAPIKey},
		{name: "key header", status: 200},
		{name: "bearer", headers: []string{api.HeaderAPIKey, "", "Authorization", "Bearer " + testKey}, status: 200},
		{name: "bearer any case", headers: []string{api.HeaderAPIKey, "", "Authorization", "bearer " + testKey}, status: 200},
		{name: "wrong bearer", headers: []string{api.HeaderAPIKey, "", "Authorization", "Bearer wrong"}, status: 401, code: codeInvalidAPIKey},
		{name: "basic is not bearer", headers: []string{api.HeaderAPIKey, "", "Authorization", "Basic " + testKey}, status: 401, code: codeMissingAPIKey},
		{name: "public", public: true, headers: []string{api.HeaderAPIKey, ""}, status: 200},
		{name: "public ignores a wrong key", public: true, headers: []string{api.HeaderAPIKey, "wrong"}, status: 200},
		{name: "insecure", insecure: true, headers: []string{api.HeaderAPIKey, ""}, status: 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, _ := newEnv(t, func(cfg *Config) {
				cfg.MetricsPublic = c.public
				if c.insecure {
					cfg.APIKey, cfg.Insecure = "", true
				}
			})
			for _, path := range []string{"/metrics", "/v1/metrics"} {
				r := e.call("GET", path, "", c.headers...)
				if c.status == 200 {
					r.wantStatus(t, 200)
					if !bytes.Contains(r.body, []byte("opensandbox_sandboxes{")) {
						t.Errorf("GET %s: no opensandbox_sandboxes in\n%s", path, r.body)
					}
				} else {
					r.wantError(t, c.status, c.code)
				}
			}
		})
	}
	t.Run("bearer only for metrics", func(t *testing.T) {
		e, _ := newEnv(t, func(cfg *Config) { cfg.MetricsPublic = true })
		e.call("GET", "/v1/sandboxes", "", api.HeaderAPIKey, "", "Authorization", "Bearer "+testKey).wantError(t, 401, codeMissingAPIKey)
		e.call("GET", "/v1/sandboxes", "", api.HeaderAPIKey, "").wantError(t, 401, codeMissingAPIKey)
		e.call("POST", "/metrics", "", api.HeaderAPIKey, "").wantError(t, 405, codeMethodNotAllowed)
	})
}

// poolRuntime is the fake with warm pools to report, or an error.
type poolRuntime struct {
	*fake.Runtime
	pools []sandbox.PoolSize
	err   error
}

func (r *poolRuntime) Pools(ctx context.Context) ([]sandbox.PoolSize, error) { return r.pools, r.err }

// failingList is the fake whose List fails.
type failingList struct{ *fake.Runtime }

func (failingList) List(ctx context.Context) ([]*sandbox.Sandbox, error) {
	return nil, fmt.Errorf("engine away: %w", sandbox.ErrUnavailable)
}

func TestMetricsPools(t *testing.T) {
	rt := &poolRuntime{Runtime: fake.New(), pools: []sandbox.PoolSize{
		{Name: "python", Total: 10, Allocated: 3, Available: 5},
		{Name: "node", Total: 2, Allocated: 0, Available: 2},
	}}
	m := NewMetrics()
	e := newEnvWith(t, rt, func(c *Config) { c.Metrics = m })
	m.PoolClaim("python", true)
	m.PoolClaim("python", true)
	m.PoolClaim("python", false)

	fams := e.scrape()
	for _, c := range []struct {
		pool, state string
		want        float64
	}{
		{"python", "available", 5}, {"python", "allocated", 3}, {"python", "starting", 2},
		{"node", "available", 2}, {"node", "allocated", 0}, {"node", "starting", 0},
	} {
		if got := one(t, fams, "opensandbox_pool_sandboxes", map[string]string{"pool": c.pool, "state": c.state}).GetGauge().GetValue(); got != c.want {
			t.Errorf("opensandbox_pool_sandboxes{pool=%q,state=%q} = %g, want %g", c.pool, c.state, got, c.want)
		}
	}
	for result, want := range map[string]float64{"hit": 2, "miss": 1} {
		if got := one(t, fams, "opensandbox_pool_claims_total", map[string]string{"pool": "python", "result": result}).GetCounter().GetValue(); got != want {
			t.Errorf("opensandbox_pool_claims_total{pool=python,result=%q} = %g, want %g", result, got, want)
		}
	}

	// A runtime that cannot answer costs its own series, not the scrape.
	rt.err = errors.New("pools away")
	fams = e.scrape()
	if fams["opensandbox_pool_sandboxes"] != nil || fams["opensandbox_sandboxes"] == nil || fams["opensandbox_http_request_duration_seconds"] == nil {
		t.Errorf("after Pools failed: pool series %v, sandboxes %v", fams["opensandbox_pool_sandboxes"] != nil, fams["opensandbox_sandboxes"] != nil)
	}
}

func TestMetricsListFails(t *testing.T) {
	e := newEnvWith(t, failingList{fake.New()})
	e.call("GET", "/health", "").wantStatus(t, 200)
	fams := e.scrape()
	if fams["opensandbox_sandboxes"] != nil || fams["opensandbox_http_request_duration_seconds"] == nil {
		t.Errorf("with List failing: want the other series and no opensandbox_sandboxes")
	}
}

func TestMetricsObserver(t *testing.T) {
	m := NewMetrics()
	m.SandboxReady(sandbox.CreatePooled, 20*time.Millisecond)
	m.SandboxReady("pooled", 40*time.Millisecond)
	m.ImagePulled("busybox", 2*time.Second, nil)
	m.ImagePulled("busybox", time.Second, fmt.Errorf("pull: %w", errors.New("denied")))
	m.ImagePulled("busybox", time.Second, fmt.Errorf("%w: engine said so", context.Canceled))
	m.Reconciled(sandbox.LoopRuntime, 3*time.Millisecond, nil)
	m.Reconciled(sandbox.LoopRuntime, 3*time.Millisecond, errors.New("engine away"))

	if n := testutil.CollectAndCount(m.createDur); n != 2 {
		t.Errorf("create series: %d, want cold and pooled", n)
	}
	for _, c := range []struct {
		name   string
		labels []string
		count  uint64
		sum    float64
	}{
		{"create pooled", []string{"pooled"}, 2, 0.06},
		{"create cold", []string{"cold"}, 0, 0},
		{"pull success", []string{"success"}, 1, 2},
		{"pull error", []string{"error"}, 1, 1},
		{"pull canceled", []string{"canceled"}, 1, 1},
		{"reconcile success", []string{"runtime", "success"}, 1, 0.003},
		{"reconcile error", []string{"runtime", "error"}, 1, 0.003},
		{"expiry", []string{"expiry", "success"}, 0, 0},
	} {
		vec := m.createDur
		switch {
		case strings.HasPrefix(c.name, "pull"):
			vec = m.pullDur
		case strings.HasPrefix(c.name, "reconcile"), c.name == "expiry":
			vec = m.reconDur
		}
		h := histogramOf(t, vec, c.labels...)
		if h.GetSampleCount() != c.count || h.GetSampleSum() < c.sum-1e-9 || h.GetSampleSum() > c.sum+1e-9 {
			t.Errorf("%s: count %d sum %g, want %d %g", c.name, h.GetSampleCount(), h.GetSampleSum(), c.count, c.sum)
		}
	}
}

func TestMetricsExpirySweep(t *testing.T) {
	rt := fake.New()
	m := NewMetrics()
	mgr := NewManager(rt, ManagerConfig{Observer: m})
	past := time.Now().Add(-time.Second)
	if _, err := rt.Create(context.Background(), "old", sandbox.Spec{Image: "x", ExpiresAt: &past}); err != nil {
		t.Fatal(err)
	}
	mgr.expire(context.Background())
	if _, err := rt.Get(context.Background(), "old"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("expired sandbox still there: %v", err)
	}
	rt.FailNext("Delete", errors.New("engine away"))
	if _, err := rt.Create(context.Background(), "old2", sandbox.Spec{Image: "x", ExpiresAt: &past}); err != nil {
		t.Fatal(err)
	}
	mgr.expire(context.Background())
	for result, n := range map[string]uint64{"success": 1, "error": 1} {
		if got := histogramOf(t, m.reconDur, sandbox.LoopExpiry, result).GetSampleCount(); got != n {
			t.Errorf("expiry sweeps with result %s: %d, want %d", result, got, n)
		}
	}
}

func TestMetricsServeOneServer(t *testing.T) {
	m := NewMetrics()
	mgr := NewManager(fake.New(), ManagerConfig{})
	if _, err := New(mgr, Config{APIKey: testKey, Metrics: m}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(mgr, Config{APIKey: testKey, Metrics: m, Logger: slog.New(slog.DiscardHandler)}); err == nil {
		t.Fatal("a second server on one Metrics: no error")
	}
}

func TestRouteLabel(t *testing.T) {
	for pattern, want := range map[string]string{
		"GET /v1/sandboxes/{id}":                  "/sandboxes/{id}",
		"GET /sandboxes/{id}":                     "/sandboxes/{id}",
		"POST /v1/sandboxes":                      "/sandboxes",
		"/v1/sandboxes/{id}/endpoints/{port}":     "/sandboxes/{id}/endpoints/{port}",
		"DELETE /snapshots/{id}":                  "/snapshots/{id}",
		"GET /v1/sandboxes/{id}/diagnostics/logs": "/sandboxes/{id}/diagnostics/logs",
		"GET /metrics":                            "/metrics",
		"/":                                       "other",
		"":                                        "other",
	} {
		if got := routeLabel(pattern); got != want {
			t.Errorf("routeLabel(%q) = %q, want %q", pattern, got, want)
		}
	}
	for method, want := range map[string]string{"GET": "GET", "PATCH": "PATCH", "BREW": "other", "get": "other"} {
		if got := methodLabel(method); got != want {
			t.Errorf("methodLabel(%q) = %q, want %q", method, got, want)
		}
	}
}

// BenchmarkObserveRequest is what metrics add to every API request.
func BenchmarkObserveRequest(b *testing.B) {
	m := NewMetrics()
	b.ReportAllocs()
	for b.Loop() {
		m.observeRequest("/sandboxes/{id}", "GET", http.StatusOK, time.Millisecond)
	}
}

// BenchmarkGetSandbox is a whole instrumented request, in process: GET
// /v1/sandboxes/{id} on the fake.
func BenchmarkGetSandbox(b *testing.B) {
	rt := fake.New()
	srv, err := New(NewManager(rt, ManagerConfig{}), Config{APIKey: testKey})
	if err != nil {
		b.Fatal(err)
	}
	sb, err := rt.Create(context.Background(), sandbox.NewID(), sandbox.Spec{Image: "x"})
	if err != nil {
		b.Fatal(err)
	}
	h := srv.Handler()
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest("GET", "/v1/sandboxes/"+string(sb.ID), nil)
		req.Header.Set(api.HeaderAPIKey, testKey)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}
