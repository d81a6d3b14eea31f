package execd

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/cgroup"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

const (
	// cpuWindow is the age a CPU sample must reach before /metrics measures
	// against it; younger samples are used only when there is no older one.
	cpuWindow = 500 * time.Millisecond
	// cpuSampleSpacing is the least time between two kept samples, which
	// bounds how many are kept however often /metrics is called.
	cpuSampleSpacing = 100 * time.Millisecond
	// metricsWatchInterval is the period of /metrics/watch.
	metricsWatchInterval = time.Second
)

// metricsSampler answers /metrics from the cgroup of the execd process
// without waiting: it keeps the CPU samples taken by earlier calls (and one
// taken at start) and measures CPU use since the newest one at least
// cpuWindow old. Nothing runs between calls. Safe for concurrent use.
type metricsSampler struct {
	cfg cgroup.Config

	mu      sync.Mutex
	group   *cgroup.Group // nil until the cgroup was found
	samples cpuSamples
}

// newMetricsSampler returns a sampler of the process's own cgroup.
func newMetricsSampler() *metricsSampler {
	return newMetricsSamplerFor(cgroup.Config{})
}

// newMetricsSamplerFor returns a sampler of the cgroup that cfg finds, and
// takes the first CPU sample.
func newMetricsSamplerFor(cfg cgroup.Config) *metricsSampler {
	m := &metricsSampler{cfg: cfg}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.openLocked() == nil {
		if usage, err := m.group.CPUUsage(); err == nil {
			m.samples.add(cpuSample{at: time.Now(), usage: usage})
		}
	}
	return m
}

// openLocked finds the cgroup if that has not succeeded yet, so a daemon
// started before /proc was complete recovers on a later call.
func (m *metricsSampler) openLocked() error {
	if m.group != nil {
		return nil
	}
	g, err := cgroup.Open(m.cfg)
	if err != nil {
		return fmt.Errorf("find the sandbox's cgroup: %w", err)
	}
	m.group = g
	return nil
}

// read returns the sandbox's current figures. CPU use is measured since an
// earlier sample; the first call after start measures since New.
func (m *metricsSampler) read() (api.Metrics, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.openLocked(); err != nil {
		return api.Metrics{}, err
	}
	st, err := m.group.Read()
	now := time.Now()
	if err != nil {
		return api.Metrics{}, fmt.Errorf("read the sandbox's cgroup: %w", err)
	}
	cur := cpuSample{at: now, usage: st.CPUUsage}
	var pct float64
	if base, ok := m.samples.add(cur); ok {
		pct = cpuPercent(base, cur, st.CPUs)
	}
	return api.Metrics{
		CPUCount:    st.CPUs,
		CPUUsedPct:  pct,
		MemTotalMiB: float64(st.MemLimit) / (1 << 20),
		MemUsedMiB:  float64(st.MemUsed) / (1 << 20),
		Timestamp:   now.UnixMilli(),
	}, nil
}

// cpuSample is the cgroup's CPU time at one instant.
type cpuSample struct {
	at    time.Time // with its monotonic reading
	usage time.Duration
}

// cpuSamples holds recent samples, oldest first. Every sample but the
// oldest is younger than cpuWindow and they are cpuSampleSpacing apart, so
// at most cpuWindow/cpuSampleSpacing+2 are kept.
type cpuSamples []cpuSample

// add returns the sample to measure cur against: the newest at least
// cpuWindow older than cur, else the oldest; ok is false when there is
// none. It drops the samples no later call can choose and keeps cur unless
// the newest kept sample is too recent.
func (ss *cpuSamples) add(cur cpuSample) (base cpuSample, ok bool) {
	s := *ss
	if len(s) == 0 {
		*ss = append(s, cur)
		return cpuSample{}, false
	}
	i := 0
	for j := len(s) - 1; j > 0; j-- {
		if cur.at.Sub(s[j].at) >= cpuWindow {
			i = j
			break
		}
	}
	base = s[i]
	// A later call finds s[i] or a newer sample old enough, never an older one.
	s = append(s[:0], s[i:]...)
	if cur.at.Sub(s[len(s)-1].at) >= cpuSampleSpacing {
		s = append(s, cur)
	}
	*ss = s
	return base, true
}

// cpuPercent returns the share of cpus used between two samples, 0 to 100.
func cpuPercent(base, cur cpuSample, cpus float64) float64 {
	wall := cur.at.Sub(base.at)
	if wall <= 0 || cpus <= 0 {
		return 0
	}
	pct := float64(cur.usage-base.usage) / float64(wall) / cpus * 100
	return min(max(pct, 0), 100)
}

// getMetrics answers GET /metrics at once with the sandbox's figures.
func (s *Server) getMetrics(w http.ResponseWriter, r *http.Request) error {
	m, err := s.metrics.read()
	if err != nil {
		return err // 500 RUNTIME_ERROR
	}
	httpx.WriteJSON(w, http.StatusOK, m)
	return nil
}

// watchMetrics answers GET /metrics/watch: one Metrics object at once,
// then one every metricsWatchInterval, each followed by a blank line; a
// failed reading sends {"error":"..."} instead. It ends when the client
// goes or the server shuts down.
func (s *Server) watchMetrics(w http.ResponseWriter, r *http.Request) error {
	httpx.StartStream(w)
	rc := http.NewResponseController(w)
	tick := time.NewTicker(metricsWatchInterval)
	defer tick.Stop()
	var line []byte
	for {
		var v any
		m, err := s.metrics.read()
		if err != nil {
			s.log.Debug("metrics watch: read failed", "err", err)
			v = map[string]string{"error": err.Error()}
		} else {
			v = m
		}
		line, _ = json.Marshal(v) // a map of strings and a struct of numbers always encode
		line = append(line, '\n', '\n')
		if _, err := w.Write(line); err != nil {
			return nil // the client has gone
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
		select {
		case <-tick.C:
		case <-r.Context().Done():
			return nil
		case <-s.stop:
			return nil
		}
	}
}
