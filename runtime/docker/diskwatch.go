package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/sandbox"
)

// The disk watcher enforces storage limits where the engine does not: it
// measures what each sandbox with a limit occupies on the host's disk and
// stops one that is over it (Failed, DISK_LIMIT_EXCEEDED), as the kubelet
// does for a pod over its ephemeral-storage.
//
// What counts (docs/configuration.md says the same to operators):
//   - the container's writable layer (overlay2's upper directory): every
//     file the sandbox wrote, or changed, outside its volumes;
//   - the engine's files mounted writable at /etc/hosts, /etc/resolv.conf
//     and /etc/hostname, which live outside the layer;
//   - the named volumes the server made (its label scope) that the
//     sandbox mounts writable, in full (a volume shared by two sandboxes
//     counts for each);
//   - files deleted while the sandbox's processes still hold them open or
//     map them shared and writable, whose blocks stay allocated.
//
// What does not: tmpfs (/dev/shm, and gVisor's /tmp), which is memory and
// counts toward the memory limit; host volumes, which are the operator's
// directories; the container's log, which the engine caps instead
// (logMaxSize × logFiles); the image's own layers, which are shared.
//
// A measurement walks every tree, so it is not free: how often a sandbox
// is measured follows how close it is to its limit and how fast it grew
// (checkInterval), and the watcher rests after each measurement so that it
// never takes more than 1/watchDuty of a CPU.

// Measurement pacing.
const (
	// assumedWriteRate is how fast a sandbox is taken to be able to
	// fill its disk when it has not been seen growing faster: about what
	// one writing into its page cache reaches here. A sandbox is measured
	// again before it could have reached its limit at that rate.
	assumedWriteRate = 4 << 30 // bytes per second
	// minCheckInterval and maxCheckInterval bound the time between two
	// measurements of a sandbox.
	minCheckInterval = 10 * time.Millisecond
	maxCheckInterval = 10 * time.Second
	// costFactor: a sandbox is measured at most once per costFactor
	// times as long as measuring it took, so that one with a huge tree
	// of files is not measured without pause.
	costFactor = 10
	// watchDuty: after each measurement the watcher rests watchDuty-1
	// times as long as it took, so it uses at most 1/watchDuty of a CPU
	// however many sandboxes there are (they are measured less often
	// instead).
	watchDuty = 4
	// syncInterval is how often the watcher looks for sandboxes that
	// started or stopped; a sandbox whose container starts is looked at
	// at once.
	syncInterval = time.Second
)

// checkInterval returns how long a sandbox that uses used of its limit,
// grew at rate bytes per second lately, and took cost to measure, may go
// before it is measured again: the time it needs to fill what is left at
// the faster of twice its rate and assumedWriteRate, within
// [minCheckInterval, maxCheckInterval], and at least costFactor × cost.
func checkInterval(limit, used int64, rate float64, cost time.Duration) time.Duration {
	left := float64(max(limit-used, 0))
	speed := max(2*rate, assumedWriteRate)
	d := time.Duration(left / speed * float64(time.Second))
	d = min(max(d, minCheckInterval), maxCheckInterval)
	return max(d, costFactor*cost)
}

// growthRate is a sandbox's recent growth rate after it grew by grown
// bytes in elapsed, given the rate before: the new observation, or half
// the old one if that is more, so a burst keeps measurements frequent
// for a while.
func growthRate(prev float64, grown int64, elapsed time.Duration) float64 {
	obs := 0.0
	if elapsed > 0 && grown > 0 {
		obs = float64(grown) / elapsed.Seconds()
	}
	return max(obs, prev/2)
}

// diskWatch is the watcher's state. Only its goroutine (watchDisks)
// touches it, except wake and what mu guards.
type diskWatch struct {
	// wake asks the watcher to look for new sandboxes now.
	wake chan struct{}
	mu   sync.Mutex
	// handed are containers just started, as provisioning inspected
	// them: the watcher takes them without asking the engine again.
	handed map[sandbox.ID]containerInfo
	// measured maps each sandbox measured at least once since its
	// container's init started to that init's PID; measuredCh is closed
	// and replaced whenever a sandbox joins it. A held entrypoint waits
	// for it (held.go).
	measured   map[sandbox.ID]int
	measuredCh chan struct{}
	// problems says why a sandbox's files could not be found, until they
	// are.
	problems map[sandbox.ID]error

	watched map[sandbox.ID]*watchedSandbox
	// measurements counts the measurements made, busy the time they
	// took (nanoseconds): what watching costs.
	measurements, busy atomic.Int64
	// unlimited are sandboxes looked at that have no limit.
	unlimited map[sandbox.ID]bool
	counter   usageCounter
}

// watchedSandbox is one sandbox with a storage limit, and where its files
// are.
type watchedSandbox struct {
	id    sandbox.ID
	limit int64
	// trees are directories counted in full: the writable layer and
	// the server's volumes it mounts writable.
	trees []string
	// files are single files counted: the engine's /etc files.
	files []string
	// procs is its cgroup's cgroup.procs ("" when not found).
	procs string
	// pidfd refers to its container's init process (-1 for none): a
	// signal to it stops the sandbox at once, and never reaches another
	// process that reused the PID. pid is that process's PID, and
	// announced is set once a measurement of it was made known (measured).
	pidfd     int
	pid       int
	announced bool

	last   diskUsage
	lastAt time.Time
	rate   float64
	// cost is how long measuring it takes, smoothed.
	cost time.Duration
	due  time.Time
	// failures counts measurements in a row that failed.
	failures int
}

// maxMeasureFailures is how many measurements of a sandbox may fail in a
// row before it is stopped: a sandbox whose disk cannot be measured
// cannot be held to its limit.
const maxMeasureFailures = 5

func newDiskWatch() *diskWatch {
	return &diskWatch{wake: make(chan struct{}, 1), handed: map[sandbox.ID]containerInfo{}, watched: map[sandbox.ID]*watchedSandbox{},
		unlimited: map[sandbox.ID]bool{}, measured: map[sandbox.ID]int{}, measuredCh: make(chan struct{}), problems: map[sandbox.ID]error{}}
}

// forget stops watching a sandbox.
func (w *diskWatch) forget(id sandbox.ID) {
	if ws := w.watched[id]; ws != nil {
		if ws.pidfd >= 0 {
			unix.Close(ws.pidfd)
		}
		delete(w.watched, id)
	}
	w.mu.Lock()
	delete(w.measured, id)
	delete(w.problems, id)
	w.mu.Unlock()
}

// announce makes known that ws was measured: whoever waits for it to be
// (waitMeasured) goes on.
func (w *diskWatch) announce(ws *watchedSandbox) {
	ws.announced = true
	w.mu.Lock()
	w.measured[ws.id] = ws.pid
	close(w.measuredCh)
	w.measuredCh = make(chan struct{})
	w.mu.Unlock()
}

// waitMeasured waits until the sandbox id has been measured since the
// process pid, its container's init, started, or ctx ends; it then says
// why its files could not be found, if they could not.
func (w *diskWatch) waitMeasured(ctx context.Context, id sandbox.ID, pid int) error {
	for {
		w.mu.Lock()
		done, ch, problem := w.measured[id] == pid, w.measuredCh, w.problems[id]
		w.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			if problem != nil {
				return fmt.Errorf("%w (%w)", ctx.Err(), problem)
			}
			return ctx.Err()
		}
	}
}

// setProblem records why the files of id could not be found (nil: they
// were).
func (w *diskWatch) setProblem(id sandbox.ID, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		delete(w.problems, id)
	} else {
		w.problems[id] = err
	}
}

// started hands the watcher a sandbox whose container has just started,
// inspected (info): one with a limit is measured at once, before it can
// have written much, and the engine is asked nothing more of either.
func (w *diskWatch) started(id sandbox.ID, info containerInfo) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.handed[id] = info
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// takeHanded returns the containers handed over since the last call.
func (w *diskWatch) takeHanded() map[sandbox.ID]containerInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.handed) == 0 {
		return nil
	}
	h := w.handed
	w.handed = map[sandbox.ID]containerInfo{}
	return h
}

// watchDisks is the watcher's loop: it runs as long as the runtime.
func (r *Runtime) watchDisks() {
	defer r.wg.Done()
	w := r.disk
	defer func() {
		for id := range w.watched {
			w.forget(id)
		}
	}()
	var nextSync time.Time
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if now := time.Now(); !now.Before(nextSync) {
			r.syncWatched()
			nextSync = now.Add(syncInterval)
		}
		due := w.dueBy(time.Now())
	measuring:
		for _, ws := range due {
			if r.ctx.Err() != nil {
				return
			}
			start := time.Now()
			r.measure(ws)
			if !r.rest(time.Since(start) * (watchDuty - 1)) {
				return
			}
			select {
			case <-w.wake:
				// A sandbox started: it goes before the rest of this
				// round.
				nextSync = time.Time{}
				break measuring
			default:
			}
		}
		if nextSync.IsZero() {
			continue
		}
		next := nextSync
		for _, ws := range w.watched {
			if ws.due.Before(next) {
				next = ws.due
			}
		}
		timer.Reset(max(time.Until(next), 0))
		select {
		case <-r.ctx.Done():
			return
		case <-w.wake:
			nextSync = time.Time{}
		case <-timer.C:
		}
	}
}

// rest waits d, or until the runtime closes (false).
func (r *Runtime) rest(d time.Duration) bool {
	if d <= 0 {
		return r.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// dueBy returns the sandboxes due for a measurement at now, earliest
// first.
func (w *diskWatch) dueBy(now time.Time) []*watchedSandbox {
	var due []*watchedSandbox
	for _, ws := range w.watched {
		if !ws.due.After(now) {
			due = append(due, ws)
		}
	}
	slices.SortFunc(due, func(a, b *watchedSandbox) int { return a.due.Compare(b.due) })
	return due
}

// diskCandidates lists the sandboxes whose containers may be writing:
// started (Pending once the container runs, and Running), not being
// deleted, not failed.
func (r *Runtime) diskCandidates() map[sandbox.ID]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[sandbox.ID]bool, len(r.byID))
	for id, e := range r.byID {
		st := e.sb.Status
		if !e.deleting && (st.State == sandbox.StateRunning || (st.State == sandbox.StatePending && st.Reason == "CONTAINER_STARTING")) {
			out[id] = true
		}
	}
	return out
}

// syncWatched matches the watched sandboxes with the index: it starts
// watching sandboxes that started (handed over by provisioning, or one
// inspect each, to learn their limit and where their files are), and
// forgets those that stopped.
func (r *Runtime) syncWatched() {
	w := r.disk
	live := r.diskCandidates()
	for id := range w.watched {
		if !live[id] {
			w.forget(id)
		}
	}
	for id := range w.unlimited {
		if !live[id] {
			delete(w.unlimited, id)
		}
	}
	handed := w.takeHanded()
	for id, info := range handed {
		if ws := w.watched[id]; ws != nil && ws.pid != info.Files.Pid {
			// Its container started again: its init is another process.
			w.forget(id)
		}
	}
	for id := range live {
		if w.watched[id] != nil || w.unlimited[id] {
			continue
		}
		var ws *watchedSandbox
		var err error
		if info, ok := handed[id]; ok {
			ws, err = r.watchedFrom(id, info.ID, info.Labels, info.Files)
		} else {
			ws, err = r.locateFiles(id)
		}
		w.setProblem(id, err)
		switch {
		case err != nil:
			r.log.Warn("find the files of a sandbox to measure them; trying again", "sandbox", id, "err", err)
		case ws == nil:
			w.unlimited[id] = true
		default:
			w.watched[id] = ws
		}
	}
}

// locateFiles finds a sandbox's limit and where its files are, from its
// container; nil for a sandbox without a limit.
func (r *Runtime) locateFiles(id sandbox.ID) (*watchedSandbox, error) {
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	info, err := r.eng.inspect(ctx, containerName(id))
	if err != nil {
		return nil, fmt.Errorf("inspect container: %w", err)
	}
	return r.watchedFrom(id, info.ID, info.Labels, info.Files)
}

// watchedFrom is what the watcher measures of a sandbox whose container
// has labels and files f; nil for a sandbox without a limit. Named
// volumes of the server's scope are counted: their labels are asked of
// the engine.
func (r *Runtime) watchedFrom(id sandbox.ID, cid string, labels map[string]string, f containerFiles) (*watchedSandbox, error) {
	limit, _ := strconv.ParseInt(labels[labelStorage], 10, 64)
	if limit <= 0 {
		return nil, nil
	}
	if !f.Running {
		return nil, errors.New("its container is not running yet")
	}
	if f.UpperDir == "" {
		return nil, fmt.Errorf("the engine gives no writable layer directory (storage driver not overlay2?)")
	}
	ws := &watchedSandbox{id: id, limit: limit, trees: []string{f.UpperDir}, files: f.EtcFiles, due: time.Now(), pidfd: -1, pid: f.Pid}
	for _, v := range f.Volumes {
		if v.Driver != "" && v.Driver != "local" {
			continue // a volume plugin's storage is its own
		}
		ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
		vl, ok, err := r.eng.volumeExists(ctx, v.Name)
		cancel()
		if err != nil {
			return nil, err
		}
		if ok && vl[labelScope] == r.cfg.LabelScope {
			ws.trees = append(ws.trees, v.Source)
		}
	}
	// Volumes mounted at a sub path reach the container as binds of
	// their pins: counted in full from the volume itself, as the others.
	for _, name := range strings.Split(labels[labelSubPathVolumes], ",") {
		if name == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
		vi, err := r.eng.volumeInfo(ctx, name)
		cancel()
		if err != nil {
			return nil, err
		}
		if vi.Labels[labelScope] == r.cfg.LabelScope && vi.Mountpoint != "" && !slices.Contains(ws.trees, vi.Mountpoint) {
			ws.trees = append(ws.trees, vi.Mountpoint)
		}
	}
	// The pid comes from an inspect that may be stale: the process is
	// pinned first, then its cgroup must be the container's, and it must
	// still be alive once that was read, or the pid could name another
	// process by now (and stopping the sandbox would kill that one's).
	fd, err := unix.PidfdOpen(f.Pid, 0)
	if err != nil {
		return nil, fmt.Errorf("its init process %d: %w", f.Pid, err)
	}
	procs, err := cgroupProcsFile(f.Pid)
	if err == nil && (cid == "" || !strings.Contains(procs, cid)) {
		err = fmt.Errorf("process %d is in %s, not in container %.12s's cgroup", f.Pid, procs, cid)
	}
	if err == nil {
		err = unix.PidfdSendSignal(fd, 0, nil, 0)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("its init process %d: %w", f.Pid, err)
	}
	ws.procs, ws.pidfd = procs, fd
	return ws, nil
}

// measure measures one sandbox, stops it if it is over its limit, and
// decides when to measure it next.
func (r *Runtime) measure(ws *watchedSandbox) {
	c := &r.disk.counter
	c.reset()
	start := time.Now()
	var err error
	for _, t := range ws.trees {
		if err = c.addTree(t); err != nil {
			break
		}
	}
	for _, f := range ws.files {
		if err == nil {
			err = c.addFile(f)
		}
	}
	if err == nil && ws.procs != "" {
		if perr := c.addUnlinked(ws.procs); perr != nil {
			// The processes' cgroup has gone: the container stopped, and
			// the next sync forgets it.
			r.log.Debug("list a sandbox's processes", "sandbox", ws.id, "err", perr)
		}
	}
	now := time.Now()
	r.disk.measurements.Add(1)
	r.disk.busy.Add(int64(now.Sub(start)))
	// The cost is smoothed, so that one slow measurement (a cold cache,
	// a busy disk) does not space out the next ones.
	ws.cost = (3*ws.cost + now.Sub(start)) / 4
	u := c.total
	switch {
	case errors.Is(err, errTooDeep):
		r.stopOverLimit(ws, fmt.Sprintf("the sandbox's files cannot be measured against its ephemeral-storage limit of %s: it made %v; it was stopped", formatBytes(ws.limit), errTooDeep))
		return
	case err != nil:
		ws.failures++
		r.log.Warn("measure a sandbox's disk use", "sandbox", ws.id, "failures", ws.failures, "err", err)
		if ws.failures >= maxMeasureFailures {
			r.stopOverLimit(ws, fmt.Sprintf("the sandbox's files cannot be measured against its ephemeral-storage limit of %s (%d attempts in a row failed: %v); it was stopped", formatBytes(ws.limit), ws.failures, err))
			return
		}
		// Tried again as soon as a good measurement would be: a failure
		// must not buy the sandbox time.
		ws.due = now.Add(checkInterval(ws.limit, ws.last.Bytes, ws.rate, ws.cost))
		return
	}
	ws.failures = 0
	if !ws.lastAt.IsZero() {
		ws.rate = growthRate(ws.rate, u.Bytes-ws.last.Bytes, now.Sub(ws.lastAt))
	}
	ws.last, ws.lastAt = u, now
	if u.Bytes > ws.limit {
		msg := fmt.Sprintf("the sandbox's files take %s of disk (%d files", formatBytes(u.Bytes), u.Files)
		if u.Hidden > 0 {
			msg += fmt.Sprintf(", %s of them deleted but still open", formatBytes(u.Hidden))
		}
		msg += fmt.Sprintf("), over its ephemeral-storage limit of %s; it was stopped", formatBytes(ws.limit))
		r.stopOverLimit(ws, msg)
		return
	}
	if !ws.announced {
		r.disk.announce(ws)
	}
	ws.due = now.Add(checkInterval(ws.limit, u.Bytes, ws.rate, ws.cost))
}

// stopOverLimit stops a sandbox over its limit and fails it for its
// disk. Its container is kept, with its files, as after any failure,
// until the sandbox is deleted. The sandbox is marked Failed first, so
// that the engine's "die" event finds it so and leaves the reason alone;
// then the container's init is killed directly, since every moment it
// runs it may write. Recording the failure and telling the engine take
// longer (a write to the store waits for the disk, which a sandbox
// writing at full speed keeps busy), and happen in the background, so
// that the watcher goes on measuring the others.
func (r *Runtime) stopOverLimit(ws *watchedSandbox, msg string) {
	const reason = "DISK_LIMIT_EXCEEDED"
	id := ws.id
	defer r.disk.forget(id)
	r.mu.Lock()
	e, ok := r.byID[id]
	if ok && e.provisioning() {
		// Still starting: provisioning ends quietly when cancelled, and
		// would otherwise report it Running, or failed for another reason.
		cancel, done := e.cancel, e.done
		r.mu.Unlock()
		cancel()
		<-done
		r.mu.Lock()
		e, ok = r.byID[id]
	}
	if !ok || e.deleting || e.sb.Status.State == sandbox.StateFailed {
		r.mu.Unlock()
		return
	}
	r.transitionLocked(e, sandbox.StateFailed, reason, msg)
	r.mu.Unlock()
	if ws.procs != "" {
		// Each process, directly: one writing stops within a page of
		// the signal, where the death of the namespace's init would
		// reach it only once init has run, which on busy CPUs is
		// milliseconds of writing later.
		killCgroup(ws.procs)
	}
	if ws.pidfd >= 0 {
		// Killing the init of its PID namespace kills every process in
		// it, those that started meanwhile too.
		if err := unix.PidfdSendSignal(ws.pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			r.log.Warn("kill the init of a sandbox over its storage limit", "sandbox", id, "err", err)
		}
	}
	r.log.Warn("sandbox over its storage limit: stopped", "sandbox", id, "reason", reason, "detail", msg)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.fail(e, reason, msg)
		r.stopContainer(id)
	}()
}

// killCgroup sends SIGKILL to every process of the cgroup whose
// cgroup.procs is procs. Each is signalled through a pidfd opened before
// its cgroup is checked, so a PID that changed hands since the list was
// read is never signalled.
func killCgroup(procs string) {
	b, err := os.ReadFile(procs)
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone
		}
		if mine, err := cgroupProcsFile(pid); err == nil && mine == procs {
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
		unix.Close(fd)
	}
}

// stopContainer has the engine kill a failed sandbox's container, trying
// again every second until it is stopped or gone, or the runtime closes.
func (r *Runtime) stopContainer(id sandbox.ID) {
	for {
		ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
		err := r.eng.kill(ctx, containerName(id))
		cancel()
		if err == nil || errors.Is(err, errNoSuchObject) {
			return
		}
		r.log.Error("stop the container of a sandbox over its storage limit; trying again", "sandbox", id, "err", err)
		if !r.rest(time.Second) {
			return
		}
	}
}

// formatBytes writes n bytes for people: "64 MiB", "1.5 GiB", "64.01 MiB",
// "512 B".
func formatBytes(n int64) string {
	units := []struct {
		name string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	for _, u := range units {
		if n >= u.size {
			v := strconv.FormatFloat(float64(n)/float64(u.size), 'f', 2, 64)
			return strings.TrimSuffix(strings.TrimRight(v, "0"), ".") + " " + u.name
		}
	}
	return strconv.FormatInt(n, 10) + " B"
}
