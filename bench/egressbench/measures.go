package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
	"github.com/opensandbox/opensandbox/sdk"
)

// The baselines' names.
const (
	baseNoPolicy = "same sandbox, no policy"
	baseResolver = "Docker's resolver, no policy"
)

// The targets of the issue.
const (
	coldAdded    = 50.0   // ms added at p50, cold create to first command
	pooledAdded  = 5.0    // ms added at p50, pooled
	connectAdded = 1.0    // ms added at p50, connection setup
	minMBps      = 1000.0 // MB/s of one download through the proxy
	minFraction  = 0.8    // of the download's rate without the proxy
)

// ratioOf is ours / base; 0 when base is.
func ratioOf(ours, base float64) float64 {
	if base == 0 {
		return 0
	}
	return ours / base
}

// fill sets r's figures from the timings of ours and of the baseline.
func fill(r *row, ours, base []time.Duration) {
	r.Value, r.P99 = report.Percentile(ours, 0.5), report.Percentile(ours, 0.99)
	r.Baseline, r.BaseP99 = report.Percentile(base, 0.5), report.Percentile(base, 0.99)
	r.Ratio = ratioOf(r.Value, r.Baseline)
}

// creates times create to first command of a sandbox with a policy and
// of one without, alternating, one at a time; each sandbox is removed
// before the next run.
func (b *bench) creates(ctx context.Context) ([]row, error) {
	cold := row{Name: "create to first command, cold, p50 (p99)", Unit: "ms", BaseName: baseNoPolicy,
		Target: fmt.Sprintf("p50 < %.0f ms added", coldAdded)}
	var ours, base []time.Duration
	for range b.set.creates {
		for _, p := range []*api.NetworkPolicy{basePolicy(), nil} {
			start := time.Now()
			sb, err := b.srv.createToCommand(ctx, sandboxOpts(createLimits, p))
			d := time.Since(start)
			if err = errors.Join(err, b.srv.delete(cleanupCtx(ctx), sb)); err != nil {
				return []row{cold}, err
			}
			if p != nil {
				ours = append(ours, d)
			} else {
				base = append(base, d)
			}
		}
	}
	fill(&cold, ours, base)
	cold.Note = fmt.Sprintf("%s, %d runs each, alternating; added at p50: %.0f ms (egress container first, its /healthz, then the sandbox joins its namespace)",
		image, b.set.creates, cold.Value-cold.Baseline)
	return []row{cold.Judge(cold.Value-cold.Baseline < coldAdded)}, nil
}

// pooledCreates times create to first command from a warm pool whose
// template has the policy and from one whose template has none,
// alternating, each claim taken when both pools have a sandbox ready.
func (b *bench) pooledCreates(ctx context.Context) (_ []row, retErr error) {
	r := row{Name: "create to first command, pooled, p50 (p99)", Unit: "ms", BaseName: "same pool, no policy",
		Target: fmt.Sprintf("p50 < %.0f ms added", pooledAdded)}
	pools := b.srv.c.Pools()
	names := map[string]*api.NetworkPolicy{"egress-policy": basePolicy(), "egress-none": nil}
	for name, p := range names {
		_, err := pools.Create(ctx, name, sdk.PoolTemplate{Image: image, Entrypoint: entrypoint, Resources: createLimits, NetworkPolicy: p},
			sdk.Capacity{BufferMin: 2, BufferMax: 2, PoolMax: 4})
		if err != nil {
			return []row{r}, fmt.Errorf("create pool %s: %w", name, err)
		}
		defer func() { retErr = errors.Join(retErr, pools.Delete(cleanupCtx(ctx), name)) }()
	}
	ready := func(name string) error {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			p, err := pools.Get(ctx, name)
			// Refilled and settled: no start of either pool runs beside
			// the claim being timed.
			if err == nil && p.Status != nil && p.Status.Available >= 2 && p.Status.Starting == 0 {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pool %s has no ready sandbox after 2 minutes (%v)", name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var ours, base []time.Duration
	for range b.set.creates {
		for _, name := range []string{"egress-policy", "egress-none"} {
			for _, n := range []string{"egress-policy", "egress-none"} {
				if err := ready(n); err != nil {
					return []row{r}, err
				}
			}
			start := time.Now()
			sb, err := b.srv.createToCommand(ctx, benchkit.Pooled(name, nil))
			d := time.Since(start)
			if err = errors.Join(err, b.srv.delete(cleanupCtx(ctx), sb)); err != nil {
				return []row{r}, err
			}
			if names[name] != nil {
				ours = append(ours, d)
			} else {
				base = append(base, d)
			}
		}
	}
	fill(&r, ours, base)
	r.Note = fmt.Sprintf("%d claims each, alternating, each once both pools are refilled; added at p50: %.2f ms (the egress container of a warm sandbox runs already)", b.set.creates, r.Value-r.Baseline)
	return []row{r.Judge(r.Value-r.Baseline < pooledAdded)}, nil
}

// probes makes the two sandboxes the other steps measure in, one with
// the policy and one without, uploads netprobe into both, and reads
// osb-egress's RSS before any traffic went through it.
func (b *bench) probes(ctx context.Context) ([]row, error) {
	r := row{Name: "osb-egress RSS, idle", Unit: "MB"}
	bin, err := os.ReadFile(filepath.Join(b.srv.dir, "netprobe"))
	if err != nil {
		return []row{r}, fmt.Errorf("netprobe: %w", err)
	}
	for _, sb := range []**sdk.Sandbox{&b.ours, &b.free} {
		var p *api.NetworkPolicy
		if sb == &b.ours {
			p = basePolicy()
		}
		made, err := b.srv.createToCommand(ctx, sandboxOpts(probeLimits, p))
		*sb = made
		if err != nil {
			return []row{r}, err
		}
		if err := made.Upload(ctx, sdk.UploadFile{Path: "/tmp/netprobe", Content: strings.NewReader(string(bin)), Mode: 0o755}); err != nil {
			return []row{r}, fmt.Errorf("upload netprobe: %w", err)
		}
	}
	sup, worker, err := egressRSS(ctx, b.ours.ID)
	if err != nil {
		return []row{r}, err
	}
	b.idleRSS = sup + worker
	r.Value = b.idleRSS / 1e6
	r.Note = fmt.Sprintf("VmRSS: supervisor %.1f MB + worker %.1f MB, after the sandbox's first command", sup/1e6, worker/1e6)
	return []row{r}, nil
}

// deleteProbes deletes the probe sandboxes.
func (b *bench) deleteProbes(ctx context.Context) {
	for _, sb := range []*sdk.Sandbox{b.ours, b.free} {
		if err := b.srv.delete(ctx, sb); err != nil {
			fmt.Fprintln(b.progress, "egressbench: warning:", err)
		}
	}
}

// samples are netprobe's timings as durations.
func samples(p probeResult) []time.Duration {
	ds := make([]time.Duration, len(p.Samples))
	for i, us := range p.Samples {
		ds[i] = time.Duration(us) * time.Microsecond
	}
	return ds
}

// alternate runs the netprobe bench args in both probe sandboxes for
// rounds rounds, the sandbox with the policy first in odd rounds, and
// returns the merged timings of each.
func (b *bench) alternate(ctx context.Context, rounds int, args string) (ours, base []time.Duration, err error) {
	for i := range rounds {
		order := []*sdk.Sandbox{b.free, b.ours}
		if i%2 == 1 {
			order = []*sdk.Sandbox{b.ours, b.free}
		}
		for _, sb := range order {
			p, err := netprobe(ctx, sb, args)
			if err != nil {
				return nil, nil, err
			}
			if sb == b.ours {
				ours = append(ours, samples(p)...)
			} else {
				base = append(base, samples(p)...)
			}
		}
	}
	return ours, base, nil
}

// connections times, inside each probe sandbox, new connections to the
// web server each carrying one small GET, and DNS answers for its name.
func (b *bench) connections(ctx context.Context) ([]row, error) {
	conn := row{Name: "connection setup: TCP connect + one small GET, p50 (p99)", Unit: "ms", BaseName: baseNoPolicy,
		Target: fmt.Sprintf("p50 < %.0f ms added", connectAdded)}
	dnsRow := row{Name: "DNS answer (A over UDP), p50 (p99)", Unit: "ms", BaseName: baseResolver}
	per := max(1, b.set.conns/b.set.rounds)
	ours, base, err := b.alternate(ctx, b.set.rounds, fmt.Sprintf("bench http http://%s/small -n %d -timeout 5m", webName, per))
	if err != nil {
		return []row{conn, dnsRow}, err
	}
	fill(&conn, ours, base)
	conn.Note = fmt.Sprintf("%d connections each, timed inside the sandbox (netprobe), address resolved once; added at p50: %.3f ms", len(ours), conn.Value-conn.Baseline)
	conn = conn.Judge(conn.Value-conn.Baseline < connectAdded)

	per = max(1, b.set.queries/b.set.rounds)
	ours, base, err = b.alternate(ctx, b.set.rounds, fmt.Sprintf("bench dns %s -n %d -timeout 5m", webName, per))
	if err != nil {
		return []row{conn, dnsRow}, err
	}
	fill(&dnsRow, ours, base)
	dnsRow.Note = fmt.Sprintf("%d queries each to resolv.conf's server: the DNS proxy (osb-egress) vs Docker's embedded resolver, both forwarding to the local name server", len(ours))
	return []row{conn, dnsRow}, nil
}

// download reads one large body from the web server in each probe
// sandbox, downloads times each, alternating; the medians count.
func (b *bench) download(ctx context.Context) ([]row, error) {
	mib := b.set.download >> 20
	r := row{Name: fmt.Sprintf("one %d MiB download over HTTP", mib), Unit: "MB/s", BaseName: baseNoPolicy,
		Target: fmt.Sprintf(">= %.0f MB/s and >= %.1fx", minMBps, minFraction)}
	args := fmt.Sprintf("bench download http://%s/bytes?n=%d -timeout 10m", webName, b.set.download)
	var ours, base []float64
	for i := range b.set.downloads {
		order := []*sdk.Sandbox{b.free, b.ours}
		if i%2 == 1 {
			order = []*sdk.Sandbox{b.ours, b.free}
		}
		for _, sb := range order {
			p, err := netprobe(ctx, sb, args)
			if err != nil {
				return []row{r}, err
			}
			if p.Bytes != b.set.download || p.Micros <= 0 {
				return []row{r}, fmt.Errorf("download in %s: %d bytes in %d µs, want %d bytes", sb.ID, p.Bytes, p.Micros, b.set.download)
			}
			rate := float64(p.Bytes) / float64(p.Micros) // bytes per µs = MB/s
			if sb == b.ours {
				ours = append(ours, rate)
			} else {
				base = append(base, rate)
			}
		}
	}
	r.Value, r.Baseline = median(ours), median(base)
	r.Ratio = ratioOf(r.Value, r.Baseline)
	r.Note = fmt.Sprintf("median of %d each, read inside the sandbox (netprobe); the web server runs in a namespace on this host", b.set.downloads)
	return []row{r.Judge(r.Value >= minMBps && r.Ratio >= minFraction)}, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// policyOf is a policy of n rules: the web server's and flip's names
// allowed, the rest denied names and addresses of 198.18.0.0/15 (the
// benchmarking range) in turn.
func policyOf(n int) api.NetworkPolicy {
	p := api.NetworkPolicy{DefaultAction: "deny", Egress: []api.NetworkRule{
		{Action: "allow", Target: webName}, {Action: "allow", Target: flipName}}}
	for i := range n - 2 {
		t := fmt.Sprintf("f%d.bench.test", i)
		if i%2 == 1 {
			t = fmt.Sprintf("198.18.%d.%d/32", i/256, i%256)
		}
		p.Egress = append(p.Egress, api.NetworkRule{Action: "deny", Target: t})
	}
	return p
}

// updates times PATCH /policy, each flipping flip.bench.test's rule
// between deny and allow, with policies of 10 and 1,000 rules, against
// GET /policy on the same API. PATCH answers once the change is in force
// (persisted, in nftables, in the matcher); after each run a probe from
// inside checks that the last change and one more are enforced.
func (b *bench) updates(ctx context.Context) (_ []row, retErr error) {
	var rows []row
	defer func() {
		if _, err := b.ours.SetEgressPolicy(cleanupCtx(ctx), *basePolicy()); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("restore the policy: %w", err))
		}
	}()
	for _, n := range []int{10, 1000} {
		r := row{Name: fmt.Sprintf("policy update, %d rules: PATCH until applied, p50 (p99)", n), Unit: "ms", BaseName: "GET /policy, same API"}
		if err := b.updateRow(ctx, n, &r); err != nil {
			return append(rows, r), err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func (b *bench) updateRow(ctx context.Context, n int, r *row) error {
	sb := b.ours
	if _, err := sb.SetEgressPolicy(ctx, policyOf(n)); err != nil {
		return fmt.Errorf("set a policy of %d rules: %w", n, err)
	}
	if st, err := sb.EgressPolicy(ctx); err != nil || st.Policy == nil || len(st.Policy.Egress) != n {
		return fmt.Errorf("the policy of %d rules was not kept: %+v, %v", n, st, err)
	}
	flip := func(i int) error {
		action := "allow"
		if i%2 == 0 {
			action = "deny"
		}
		_, err := sb.PatchEgress(ctx, api.NetworkRule{Action: action, Target: flipName})
		return err
	}
	for i := range 4 { // warm the connection and the caches
		if err := flip(i); err != nil {
			return err
		}
	}
	updates := b.set.updates &^ 1 // even: the last one allows
	var ours, base []time.Duration
	for i := range updates {
		start := time.Now()
		if err := flip(i); err != nil {
			return fmt.Errorf("PATCH %d: %w", i+1, err)
		}
		ours = append(ours, time.Since(start))
		start = time.Now()
		if _, err := sb.EgressPolicy(ctx); err != nil {
			return fmt.Errorf("GET: %w", err)
		}
		base = append(base, time.Since(start))
	}
	fill(r, ours, base)
	r.Note = fmt.Sprintf("%d PATCHes flipping one rule, each answered once persisted, in nftables and in the matcher; alternating with GETs", updates)
	if err := b.checkFlip(ctx, true); err != nil {
		return err
	}
	if err := flip(0); err != nil {
		return err
	}
	if err := b.checkFlip(ctx, false); err != nil {
		return err
	}
	r.Note += "; enforcement checked from inside after the run"
	return flip(1)
}

// checkFlip probes flip.bench.test from inside the sandbox with the
// policy: it must get through exactly when allowed.
func (b *bench) checkFlip(ctx context.Context, allowed bool) error {
	res, err := b.ours.Run(ctx, fmt.Sprintf("/tmp/netprobe http http://%s/small -timeout 5s", flipName), nil)
	if err != nil {
		return err
	}
	var p probeResult
	if err := json.Unmarshal([]byte(lastLine(res.Stdout)), &p); err != nil {
		return fmt.Errorf("netprobe http: output %q: %w", res.Stdout, err)
	}
	if p.OK != allowed {
		return fmt.Errorf("%s from inside after the last PATCH: got through %v, want %v (%s)", flipName, p.OK, allowed, p.Detail)
	}
	return nil
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// heldRSS opens connections through the proxy from the sandbox with the
// policy, each with one keep-alive GET, and reads osb-egress's RSS while
// all of them are open.
func (b *bench) heldRSS(ctx context.Context) ([]row, error) {
	r := row{Name: fmt.Sprintf("osb-egress RSS, %d connections held through the proxy", b.set.held), Unit: "MB",
		BaseName: "idle (above)", Baseline: b.idleRSS / 1e6}
	cmd := fmt.Sprintf("/tmp/netprobe bench hold http://%s/small -n %d -for 2m -timeout 4m > /tmp/hold.out 2>&1", webName, b.set.held)
	if _, err := b.ours.RunBackground(ctx, cmd, nil); err != nil {
		return []row{r}, fmt.Errorf("start netprobe bench hold: %w", err)
	}
	defer b.ours.Run(cleanupCtx(ctx), "pkill -f 'netprobe bench hold'", nil)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, err := b.ours.Run(ctx, "cat /tmp/hold.out", nil)
		if err != nil {
			return []row{r}, err
		}
		if line := strings.TrimSpace(res.Stdout); line != "" {
			var p probeResult
			if err := json.Unmarshal([]byte(strings.SplitN(line, "\n", 2)[0]), &p); err != nil {
				return []row{r}, fmt.Errorf("netprobe bench hold: output %q: %w", line, err)
			}
			if !p.OK || p.N != b.set.held {
				return []row{r}, fmt.Errorf("netprobe bench hold: %s", p.Detail)
			}
			break
		}
		if time.Now().After(deadline) {
			return []row{r}, errors.New("netprobe bench hold did not open its connections within 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The highest of a few reads: the worker's heap settles as the last
	// connections' buffers are allocated.
	var sup, worker float64
	for range 5 {
		s, w, err := egressRSS(ctx, b.ours.ID)
		if err != nil {
			return []row{r}, err
		}
		if s+w > sup+worker {
			sup, worker = s, w
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.Value = (sup + worker) / 1e6
	r.Ratio = ratioOf(r.Value, r.Baseline)
	r.Note = fmt.Sprintf("VmRSS: supervisor %.1f MB + worker %.1f MB, all %d open (each after one keep-alive GET)", sup/1e6, worker/1e6, b.set.held)
	return []row{r}, nil
}

// egressRSS reads VmRSS, in bytes, of the supervisor (the egress
// container's PID 1) and the worker (its child) of sandbox id.
func egressRSS(ctx context.Context, id string) (sup, worker float64, err error) {
	pid, err := docker(ctx, "inspect", "-f", "{{.State.Pid}}", "osb-"+id+"-egress")
	if err != nil {
		return 0, 0, err
	}
	if sup, err = vmRSS(pid); err != nil {
		return 0, 0, err
	}
	tasks, _ := filepath.Glob("/proc/" + pid + "/task/*/children")
	var children []string
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		children = append(children, strings.Fields(string(b))...)
	}
	if len(children) != 1 {
		return 0, 0, fmt.Errorf("the supervisor (pid %s) of osb-%s-egress has children %q, want one worker", pid, id, children)
	}
	worker, err = vmRSS(children[0])
	return sup, worker, err
}

// vmRSS reads VmRSS of the process, in bytes.
func vmRSS(pid string) (float64, error) {
	data, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%s/status: VmRSS %q: %w", pid, v, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%s/status: no VmRSS", pid)
}
