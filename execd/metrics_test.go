package execd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/cgroup"
)

func TestCPUSamples(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		at       int // ms after t0
		wantBase int // ms after t0 of the sample measured against; -1: none
		wantKept []int
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{
			name: "first call measures against the start sample",
			steps: []step{
				{at: 0, wantBase: -1, wantKept: []int{0}},
				{at: 5, wantBase: 0, wantKept: []int{0}},
				{at: 150, wantBase: 0, wantKept: []int{0, 150}},
			},
		},
		{
			name: "newest sample at least 500 ms old wins",
			steps: []step{
				{at: 0, wantBase: -1, wantKept: []int{0}},
				{at: 200, wantBase: 0, wantKept: []int{0, 200}},
				{at: 400, wantBase: 0, wantKept: []int{0, 200, 400}},
				{at: 700, wantBase: 200, wantKept: []int{200, 400, 700}},
				{at: 1300, wantBase: 700, wantKept: []int{700, 1300}},
			},
		},
		{
			name: "calls closer than the spacing are not kept",
			steps: []step{
				{at: 0, wantBase: -1, wantKept: []int{0}},
				{at: 10, wantBase: 0, wantKept: []int{0}},
				{at: 20, wantBase: 0, wantKept: []int{0}},
				{at: 100, wantBase: 0, wantKept: []int{0, 100}},
				{at: 150, wantBase: 0, wantKept: []int{0, 100}},
				{at: 620, wantBase: 100, wantKept: []int{100, 620}},
			},
		},
		{
			name: "a long pause leaves one sample and the new one",
			steps: []step{
				{at: 0, wantBase: -1, wantKept: []int{0}},
				{at: 100, wantBase: 0, wantKept: []int{0, 100}},
				{at: 60000, wantBase: 100, wantKept: []int{100, 60000}},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ss cpuSamples
			for _, st := range c.steps {
				base, ok := ss.add(cpuSample{at: at(st.at)})
				gotBase := -1
				if ok {
					gotBase = int(base.at.Sub(t0).Milliseconds())
				}
				var kept []int
				for _, s := range ss {
					kept = append(kept, int(s.at.Sub(t0).Milliseconds()))
				}
				if gotBase != st.wantBase || !equalInts(kept, st.wantKept) {
					t.Fatalf("add(at %d ms): base %d, kept %v; want base %d, kept %v", st.at, gotBase, kept, st.wantBase, st.wantKept)
				}
			}
		})
	}

	// However often it is called, the window stays small.
	var ss cpuSamples
	for ms := range 100000 {
		ss.add(cpuSample{at: at(ms)})
		if len(ss) > int(cpuWindow/cpuSampleSpacing)+2 {
			t.Fatalf("after a call every ms for %d ms: %d samples kept", ms, len(ss))
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCPUPercent(t *testing.T) {
	t0 := time.Now()
	s := func(ms int, usage time.Duration) cpuSample {
		return cpuSample{at: t0.Add(time.Duration(ms) * time.Millisecond), usage: usage}
	}
	cases := []struct {
		name      string
		base, cur cpuSample
		cpus      float64
		want      float64
	}{
		{"idle", s(0, time.Second), s(1000, time.Second), 2, 0},
		{"one of two CPUs busy", s(0, 0), s(1000, time.Second), 2, 50},
		{"half of a 1.5 CPU quota", s(0, 0), s(1000, 750*time.Millisecond), 1.5, 50},
		{"burst above the quota is capped", s(0, 0), s(1000, 3*time.Second), 2, 100},
		{"usage going backwards", s(0, time.Second), s(1000, 0), 2, 0},
		{"no time elapsed", s(0, 0), s(0, time.Second), 2, 0},
		{"no CPUs", s(0, 0), s(1000, time.Second), 0, 0},
	}
	for _, c := range cases {
		if got := cpuPercent(c.base, c.cur, c.cpus); got != c.want {
			t.Errorf("%s: cpuPercent(%v, %v, %v) = %v, want %v", c.name, c.base.usage, c.cur.usage, c.cpus, got, c.want)
		}
	}
}

// TestGetMetrics reads the figures of the cgroup the test runs in. They
// must agree with the cgroup package and come back at once.
func TestGetMetrics(t *testing.T) {
	_, c := newTestServer(t, nil)
	g, err := cgroup.Open(cgroup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := g.Read()
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	var m api.Metrics
	raw := c.call(http.MethodGet, "/metrics", nil, http.StatusOK, &m)
	took := time.Since(start)
	t.Logf("GET /metrics in %v: %s", took, raw)
	if took > 250*time.Millisecond {
		t.Errorf("GET /metrics took %v; it must not wait to sample", took)
	}
	for _, field := range []string{"cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib", "timestamp"} {
		if !bytes.Contains(raw, []byte(`"`+field+`":`)) {
			t.Errorf("body %s lacks %q", raw, field)
		}
	}
	if m.CPUCount != st.CPUs {
		t.Errorf("cpu_count = %v, the cgroup says %v", m.CPUCount, st.CPUs)
	}
	if m.CPUCount <= 0 || m.CPUCount > float64(runtime.NumCPU()) {
		t.Errorf("cpu_count = %v, want in (0, %d]", m.CPUCount, runtime.NumCPU())
	}
	if m.CPUUsedPct < 0 || m.CPUUsedPct > 100 {
		t.Errorf("cpu_used_pct = %v, want in [0, 100]", m.CPUUsedPct)
	}
	if want := float64(st.MemLimit) / (1 << 20); m.MemTotalMiB != want {
		t.Errorf("mem_total_mib = %v, the cgroup says %v", m.MemTotalMiB, want)
	}
	if m.MemUsedMiB <= 0 || m.MemUsedMiB > m.MemTotalMiB {
		t.Errorf("mem_used_mib = %v, want in (0, %v]", m.MemUsedMiB, m.MemTotalMiB)
	}
	if d := time.Since(time.UnixMilli(m.Timestamp)); d < 0 || d > 5*time.Second {
		t.Errorf("timestamp %d is %v away from now", m.Timestamp, d)
	}
}

// TestGetMetricsSeesCPUUse burns one CPU between two calls: the second
// call measures against the first and must see it.
func TestGetMetricsSeesCPUUse(t *testing.T) {
	_, c := newTestServer(t, nil)
	var before, after api.Metrics
	c.call(http.MethodGet, "/metrics", nil, http.StatusOK, &before)
	burn := 700 * time.Millisecond
	x := 0
	for start := time.Now(); time.Since(start) < burn; {
		for i := range 10000 {
			x += i
		}
	}
	runtime.KeepAlive(x)
	c.call(http.MethodGet, "/metrics", nil, http.StatusOK, &after)
	// One busy CPU out of cpu_count, less whatever the scheduler took away.
	want := 100 / after.CPUCount / 2
	t.Logf("cpu_used_pct %v before, %v after burning one CPU for %v (cpu_count %v)", before.CPUUsedPct, after.CPUUsedPct, burn, after.CPUCount)
	if after.CPUUsedPct < want {
		t.Errorf("cpu_used_pct = %v after burning one CPU, want at least %v", after.CPUUsedPct, want)
	}
}

func TestGetMetricsErrors(t *testing.T) {
	broken, err := filepath.Abs("cgroup/testdata/err-v1-missing-usage")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cfg  cgroup.Config
		want string
	}{
		{"no cgroup found", cgroup.Config{ProcDir: t.TempDir()}, "find the sandbox's cgroup"},
		{"cgroup file missing", cgroup.Config{ProcDir: filepath.Join(broken, "proc"), Root: broken}, "memory.usage_in_bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newMetricsTestServer(t, tc.cfg)
			e := c.wantError(http.MethodGet, "/metrics", nil, http.StatusInternalServerError, api.CodeRuntimeError)
			if !strings.Contains(e.Message, tc.want) {
				t.Errorf("message %q does not mention %q", e.Message, tc.want)
			}

			lines := readWatch(t, c, 1)
			var got map[string]string
			if err := json.Unmarshal(lines[0], &got); err != nil || !strings.Contains(got["error"], tc.want) {
				t.Errorf("watch line %s: want {\"error\": ...%s...} (%v)", lines[0], tc.want, err)
			}
		})
	}
}

// newMetricsTestServer starts a server whose metrics come from the cgroup
// that cfg finds.
func newMetricsTestServer(t *testing.T, cfg cgroup.Config) *testClient {
	t.Helper()
	s, err := New(Config{AccessToken: testToken, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s.metrics = newMetricsSamplerFor(cfg) // before any request can read it
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		hs.Close()
		s.Shutdown(time.Second)
	})
	return &testClient{t: t, base: hs.URL, token: testToken, hc: hs.Client()}
}

func TestWatchMetrics(t *testing.T) {
	_, c := newTestServer(t, nil)
	start := time.Now()
	lines := readWatch(t, c, 3)
	took := time.Since(start)
	// The first object comes at once, the next two a second apart.
	if took < 2*metricsWatchInterval-200*time.Millisecond || took > 2*metricsWatchInterval+time.Second {
		t.Errorf("3 objects took %v, want about %v", took, 2*metricsWatchInterval)
	}
	var prev int64
	for i, line := range lines {
		var m api.Metrics
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("object %d %s: %v", i, line, err)
		}
		if m.CPUCount <= 0 || m.MemUsedMiB <= 0 || m.CPUUsedPct < 0 || m.CPUUsedPct > 100 {
			t.Errorf("object %d: implausible %+v", i, m)
		}
		if m.Timestamp <= prev {
			t.Errorf("object %d: timestamp %d not after %d", i, m.Timestamp, prev)
		}
		prev = m.Timestamp
	}
}

// readWatch reads n objects from /metrics/watch, checks the stream's
// headers and framing (each object followed by a blank line), and leaves.
func readWatch(t *testing.T, c *testClient, n int) [][]byte {
	t.Helper()
	resp, err := c.hc.Do(c.request(http.MethodGet, "/metrics/watch", nil))
	if err != nil {
		t.Fatalf("GET /metrics/watch: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET /metrics/watch: status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	var lines [][]byte
	for range n {
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("GET /metrics/watch: after %d objects: %v", len(lines), err)
		}
		if blank, err := br.ReadBytes('\n'); err != nil || string(blank) != "\n" {
			t.Fatalf("GET /metrics/watch: object %s followed by %q, %v; want a blank line", line, blank, err)
		}
		lines = append(lines, bytes.TrimSuffix(line, []byte("\n")))
	}
	return lines
}

// TestWatchMetricsEndsWithClient checks that the watch handler returns
// when the client leaves.
func TestWatchMetricsEndsWithClient(t *testing.T) {
	s, c := newTestServer(t, nil)
	done := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.watchMetrics(w, r)
		close(done)
	}))
	defer hs.Close()
	c.base = hs.URL
	readWatch(t, c, 1) // closes the body
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watch handler still running 5 s after the client left")
	}
}

func BenchmarkGetMetrics(b *testing.B) {
	s, err := New(Config{Insecure: true, TempDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown(time.Second)
	h := s.Handler()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("GET /metrics: %d %s", w.Code, w.Body)
		}
	}
}
