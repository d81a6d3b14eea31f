// Package docker is the sandbox.Runtime on a Docker engine. Every sandbox
// is one container whose init is the static execd, mounted read-only;
// its immutable facts live in container labels and its mutable state in
// an embedded store, and an in-memory index kept current by the engine's
// event stream answers every read. Only engine.go speaks to the engine.
package docker

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

var (
	_ sandbox.Runtime         = (*Runtime)(nil)
	_ sandbox.Pauser          = (*Runtime)(nil)
	_ sandbox.Snapshotter     = (*Runtime)(nil)
	_ sandbox.Diagnoser       = (*Runtime)(nil)
	_ sandbox.Reconciler      = (*Runtime)(nil)
	_ sandbox.HostSizer       = (*Runtime)(nil)
	_ sandbox.ExtensionReader = (*Runtime)(nil)
)

// Runtime runs sandboxes as Docker containers.
type Runtime struct {
	cfg      Config
	log      *slog.Logger
	eng      *engine
	st       *store
	events   *eventLog
	pulls    *pulls
	runtimes map[string]bool // OCI runtimes the engine has
	// pinErr says why this process cannot pin volumes (see pins.go);
	// nil when it can.
	pinErr error
	// guard is the network guard installed, nil when off; only
	// reconcile passes touch it after New.
	guard *installedGuard
	size  hostSizeCache // the engine's machine, for HostSize

	// ctx lives as long as the runtime: creates and the event loop run in
	// it, not in the request that started them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// recMu orders writes of sandbox records, so that two updates of one
	// sandbox reach the store in the order they were made.
	recMu sync.Mutex
	// reconcileMu keeps reconciliations from overlapping.
	reconcileMu sync.Mutex
	// seenImages maps image references to when they were last found on
	// the engine.
	seenImages sync.Map

	mu   sync.Mutex
	byID map[sandbox.ID]*entry
	// pools are the warm pools, by name; guarded by mu.
	pools map[string]*poolState
	// poolWake asks the pool loop to look at the pools now.
	poolWake chan struct{}
	// disk measures sandboxes with a storage limit (diskwatch.go); nil
	// when the server cannot see the engine's files.
	disk *diskWatch
}

// entry is the index's view of one sandbox. Fields are guarded by
// Runtime.mu, except the channels, which are made once.
type entry struct {
	sb    sandbox.Sandbox
	token string
	// egressToken is the token of its egress API, "" when it has none.
	egressToken string
	// gen counts changes of the entry; Reconcile leaves alone an entry
	// that changed while it looked at the engine.
	gen uint64
	// ports maps container ports to their host addresses, once known.
	ports map[int]string
	// portsKnown is closed when ports are known, or when provisioning
	// ended without them.
	portsKnown chan struct{}
	knownOnce  sync.Once
	// cancel stops provisioning; done is closed when it ended. Both are
	// nil when the sandbox is not being provisioned.
	cancel   context.CancelFunc
	done     chan struct{}
	deleting bool
	oomed    bool // the engine reported an out-of-memory kill
	// requested is when Create was called in this process, with its
	// monotonic reading; zero for a sandbox found again at start, whose
	// create latency is unknown. Set before the entry is shared.
	requested time.Time

	// pool is the warm pool holding the sandbox until it is claimed:
	// while set, the sandbox is invisible to the API. from names the pool
	// it came from, for good; revision is the pool template's revision it
	// was made from; claiming marks a claim under way.
	pool     string
	from     string
	revision int64
	claiming bool
	// fresh marks a sandbox created by this process, whose provisioning
	// need not look for a container made before a restart.
	fresh bool
	// heldStart is the start of its container whose held entrypoint was
	// handed over (record.HeldStart).
	heldStart string
}

func (e *entry) markPortsKnown() { e.knownOnce.Do(func() { close(e.portsKnown) }) }

// provisioning reports whether a provision goroutine runs for e. The
// caller holds Runtime.mu.
func (e *entry) provisioning() bool {
	if e.done == nil {
		return false
	}
	select {
	case <-e.done:
		return false
	default:
		return true
	}
}

func newEntry(sb sandbox.Sandbox, token string) *entry {
	return &entry{sb: sb, token: token, ports: map[int]string{}, portsKnown: make(chan struct{})}
}

// New connects to the engine, opens the state store and rebuilds the
// index from the engine and the store: every sandbox of a previous run is
// back, creates and deletes it interrupted are finished, and leftovers are
// removed.
func New(cfg Config, logger *slog.Logger) (_ *Runtime, retErr error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	if err := cfg.Egress.LoadVaultFiles(filepath.Join(cfg.DataDir, "vault.key")); err != nil {
		return nil, err
	}
	eng, err := newEngine(cfg.Host)
	if err != nil {
		return nil, err
	}
	pingCtx, cancelPing := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelPing()
	if _, err := eng.ping(pingCtx); err != nil {
		eng.close()
		return nil, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
	}
	host, err := eng.info(pingCtx)
	if err != nil {
		eng.close()
		return nil, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
	}
	runtimes := host.runtimes
	if cfg.storage, err = findStoragePolicy(pingCtx, eng, &cfg); err != nil {
		eng.close()
		return nil, err
	}
	if cfg.Runtime != "" && cfg.Runtime != "runc" && !runtimes[cfg.Runtime] {
		eng.close()
		return nil, fmt.Errorf("runtime.docker.runtime: the engine has no runtime %q (register it in /etc/docker/daemon.json)", cfg.Runtime)
	}
	st, err := openStore(filepath.Join(cfg.DataDir, "state.db"))
	if err != nil {
		eng.close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runtime{cfg: cfg, log: logger.With("runtime", "docker"), eng: eng, st: st, runtimes: runtimes,
		ctx: ctx, cancel: cancel, byID: map[sandbox.ID]*entry{},
		pools: map[string]*poolState{}, poolWake: make(chan struct{}, 1)}
	r.size.set(hostSizeOf(host, nvidiaGPUsDir), time.Now())
	r.events = newEventLog(st, func(err error) { r.log.Warn("record events", "err", err) })
	r.log.Info("storage limits", "enforcement", cfg.storage.mode(), "how", cfg.storage.why)
	r.pulls = newPulls(eng, r.log, cfg.PullTimeout, cfg.Observer)
	defer func() {
		if retErr != nil {
			r.Close()
		}
	}()
	if err := r.ensureNetwork(ctx); err != nil {
		return nil, err
	}
	if r.guard, err = installGuard(ctx, eng, &cfg, r.log); err != nil {
		return nil, fmt.Errorf("install the sandbox network guard (it needs root and iptables on the engine's host; "+
			"block_metadata = false with blocked_cidrs = [] runs without it): %w", err)
	}
	if err := os.MkdirAll(cfg.pinsDir(), 0o700); err != nil {
		return nil, fmt.Errorf("create the volume pins' directory: %w", err)
	}
	r.pinErr = canPin(cfg.pinsDir())
	if r.pinErr == nil {
		r.pinErr = engineSeesPins(host.local, enginePidFile)
	}
	if r.pinErr != nil {
		r.log.Warn("host volumes and volume sub paths are refused: this server cannot make mounts the engine sees", "err", r.pinErr)
	}
	if cfg.storage.watchable {
		// Made before rebuild, whose resumed creates hand it their
		// sandboxes.
		r.disk = newDiskWatch()
	}
	if err := r.loadPools(); err != nil {
		return nil, err
	}
	if err := r.rebuild(ctx); err != nil {
		return nil, err
	}
	r.sweepPins()
	r.wg.Add(2)
	go r.watchEvents()
	go r.poolLoop()
	if r.disk != nil {
		r.wg.Add(1)
		go r.watchDisks()
	}
	return r, nil
}

// ensureNetwork makes the sandbox network when it is the runtime's own
// (the default): a bridge whose containers cannot reach each other.
func (r *Runtime) ensureNetwork(ctx context.Context) error {
	if r.cfg.Network != defaultNetwork {
		return nil
	}
	if err := r.eng.ensureIsolatedNetwork(ctx, defaultNetwork); err != nil {
		return fmt.Errorf("create network %s: %w", defaultNetwork, err)
	}
	return nil
}

// Close stops the runtime's background work; sandboxes keep running.
func (r *Runtime) Close() error {
	r.cancel()
	r.wg.Wait()
	r.events.close()
	r.st.close()
	return r.eng.close()
}

func (r *Runtime) scopeLabel() string { return labelScope + "=" + r.cfg.LabelScope }

func newToken() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func cloneSandbox(sb *sandbox.Sandbox) *sandbox.Sandbox {
	c := *sb
	c.Entrypoint = slices.Clone(sb.Entrypoint)
	c.Metadata = maps.Clone(sb.Metadata)
	c.Extensions = maps.Clone(sb.Extensions)
	if sb.ExpiresAt != nil {
		t := *sb.ExpiresAt
		c.ExpiresAt = &t
	}
	if sb.Platform != nil {
		p := *sb.Platform
		c.Platform = &p
	}
	return &c
}

// getLocked returns the entry of id, or ErrNotFound. r.mu must be held.
func (r *Runtime) getLocked(id sandbox.ID) (*entry, error) {
	e, ok := r.byID[id]
	if !ok || e.deleting || e.pool != "" {
		return nil, fmt.Errorf("sandbox %s: %w", id, sandbox.ErrNotFound)
	}
	return e, nil
}

// transitionLocked moves an entry to a new state and records the event.
// r.mu must be held.
func (r *Runtime) transitionLocked(e *entry, state sandbox.State, reason, msg string) {
	if e.sb.Status.State == state && e.sb.Status.Reason == reason {
		return
	}
	now := time.Now().UTC()
	e.sb.Status = sandbox.Status{State: state, Reason: reason, Message: msg, Since: now}
	e.gen++
	r.event(e.sb.ID, sandbox.Event{Time: now, Source: sandbox.SourceLifecycle, Type: reason, Message: stateMessage(state, msg)})
}

func stateMessage(state sandbox.State, msg string) string {
	if msg == "" {
		return string(state)
	}
	return string(state) + ": " + msg
}

// event records an event in the sandbox's log, in order; the write
// happens in the background.
func (r *Runtime) event(id sandbox.ID, ev sandbox.Event) { r.events.add(id, ev) }

// updateRecord changes the stored record of a sandbox: apply runs under
// r.mu on the entry (nil when the index has none) and returns the change
// to persist, which is written in the order the changes were made.
func (r *Runtime) updateRecord(id sandbox.ID, apply func(e *entry) (func(*record), error)) error {
	r.recMu.Lock()
	defer r.recMu.Unlock()
	r.mu.Lock()
	e := r.byID[id]
	if e != nil && e.deleting {
		e = nil
	}
	change, err := apply(e)
	r.mu.Unlock()
	if err != nil || change == nil {
		return err
	}
	if err := r.st.updateRecord(id, change); err != nil {
		return fmt.Errorf("record sandbox %s: %w", id, err)
	}
	return nil
}

// Create records the sandbox and starts provisioning it in the
// background: image, container, start, and the wait for execd. It returns
// at once with the sandbox Pending. Inputs that cannot work (a named
// volume that may not be used, a runtime the engine lacks) fail here,
// before anything is made.
func (r *Runtime) Create(ctx context.Context, id sandbox.ID, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	return r.create(ctx, id, spec, "", 0)
}

// errPoolGone: a warm sandbox was to be started for a pool that has been
// deleted or changed since.
var errPoolGone = errors.New("the pool no longer wants this sandbox")

// create makes a sandbox, or with pool set a warm sandbox of that pool's
// template revision, which stays invisible until claimed.
func (r *Runtime) create(ctx context.Context, id sandbox.ID, spec sandbox.Spec, pool string, revision int64) (*sandbox.Sandbox, error) {
	requested := time.Now()
	created := requested.UTC()
	token := newToken()
	if _, _, _, err := containerConfig(&r.cfg, id, &spec, created, token, pool); err != nil {
		return nil, err
	}
	egressToken := ""
	if hasEgress(&spec) {
		if err := egressNetworkOK(r.cfg.Network); err != nil {
			return nil, err
		}
		if rt := cmp.Or(spec.Extensions[extRuntime], r.cfg.Runtime); rt == "runsc" {
			// gVisor's network stack does not pass through the namespace's
			// firewall as osb-egress expects: refused rather than trusted.
			return nil, sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter,
				"networkPolicy: not enforced for sandboxes on the runsc (gVisor) runtime yet; use runc (extension docker.runtime = runc)")
		}
		egressToken = newToken()
	}
	if rt := spec.Extensions[extRuntime]; rt != "" && rt != "runc" && !r.runtimes[rt] {
		return nil, sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter,
			fmt.Sprintf("extension %s: the engine has no runtime %q", extRuntime, rt))
	}
	if err := r.checkVolumes(ctx, spec.Volumes); err != nil {
		return nil, err
	}
	if r.pinErr != nil && needsPins(spec.Volumes) {
		return nil, sandbox.Coded(sandbox.ErrInvalid, api.CodeVolumeUnsupported,
			fmt.Sprintf("host volumes and volume sub paths are not available on this server: %v", r.pinErr))
	}

	rec := &record{
		ID: id, Image: spec.Image, SnapshotID: spec.SnapshotID, Entrypoint: slices.Clone(spec.Entrypoint),
		Metadata: maps.Clone(spec.Metadata), Extensions: maps.Clone(spec.Extensions), Platform: spec.Platform,
		SecureAccess: spec.SecureAccess, CreatedAt: created, ExpiresAt: spec.ExpiresAt,
		NeededAuth: spec.ImageAuth != nil, Token: token, Pool: pool, PoolRevision: revision,
		EgressToken: egressToken,
	}
	for _, v := range spec.Volumes {
		if v.Claim != nil && v.SubPath != "" && !slices.Contains(rec.SubPathVolumes, v.Claim.Name) {
			rec.SubPathVolumes = append(rec.SubPathVolumes, v.Claim.Name)
		}
	}
	stored := spec
	stored.ImageAuth = nil
	rec.Spec = &stored

	e := newEntry(recordSandbox(rec), token)
	e.egressToken = egressToken
	e.pool, e.from, e.revision = pool, pool, revision
	e.fresh = true
	if pool == "" {
		// A warm sandbox's start is not a create anyone waits for.
		e.requested = requested
	}
	r.mu.Lock()
	if ps := r.pools[pool]; pool != "" && (ps == nil || ps.def.Revision != revision) {
		// The pool went, or changed, since this start was decided.
		r.mu.Unlock()
		return nil, fmt.Errorf("pool %s, revision %d: %w", pool, revision, errPoolGone)
	}
	if _, exists := r.byID[id]; exists {
		r.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: %w", id, sandbox.ErrConflict)
	}
	if tomb, _ := r.st.deleted(id); tomb {
		r.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s was deleted: %w", id, sandbox.ErrConflict)
	}
	r.byID[id] = e
	r.transitionLocked(e, sandbox.StatePending, "CREATING", "")
	// Marked as provisioning before anyone else can see it, so that a
	// reconcile never takes it for a sandbox whose container vanished.
	pctx := r.prepareProvisionLocked(e)
	r.mu.Unlock()
	if err := r.st.putRecord(rec); err != nil {
		r.mu.Lock()
		delete(r.byID, id)
		r.mu.Unlock()
		e.cancel()
		close(e.done)
		return nil, fmt.Errorf("record sandbox %s: %w", id, err)
	}
	r.runProvision(pctx, e, spec)
	r.mu.Lock()
	defer r.mu.Unlock()
	return cloneSandbox(&e.sb), nil
}

// recordSandbox is the sandbox a record describes, before its container
// says more.
func recordSandbox(rec *record) sandbox.Sandbox {
	return sandbox.Sandbox{
		ID: rec.ID, Image: rec.Image, SnapshotID: rec.SnapshotID, Entrypoint: slices.Clone(rec.Entrypoint),
		Metadata: maps.Clone(rec.Metadata), Extensions: maps.Clone(rec.Extensions), Platform: rec.Platform,
		SecureAccess: rec.SecureAccess, CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt,
	}
}

// Get returns the sandbox from the index.
func (r *Runtime) Get(ctx context.Context, id sandbox.ID) (*sandbox.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.getLocked(id)
	if err != nil {
		return nil, err
	}
	return cloneSandbox(&e.sb), nil
}

// List returns every sandbox of this runtime's scope from the index.
func (r *Runtime) List(ctx context.Context) ([]*sandbox.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*sandbox.Sandbox, 0, len(r.byID))
	for _, e := range r.byID {
		if !e.deleting && e.pool == "" {
			out = append(out, cloneSandbox(&e.sb))
		}
	}
	return out, nil
}

// Delete removes the sandbox's container, the named volumes made for it,
// and its record. The record is marked first and a tombstone left after,
// so a restart or a concurrent reconcile finishes the delete rather than
// bringing the sandbox back.
func (r *Runtime) Delete(ctx context.Context, id sandbox.ID) error {
	r.mu.Lock()
	e, err := r.getLocked(id)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	cancel, done := r.markDeletingLocked(e)
	r.mu.Unlock()
	return r.remove(ctx, e, cancel, done)
}

// markDeletingLocked marks e as being deleted and returns what stops its
// provisioning, if any. r.mu must be held.
func (r *Runtime) markDeletingLocked(e *entry) (context.CancelFunc, chan struct{}) {
	e.deleting = true
	e.gen++
	return e.cancel, e.done
}

// remove deletes the sandbox of e, marked deleting, with everything made
// for it.
func (r *Runtime) remove(ctx context.Context, e *entry, cancel context.CancelFunc, done chan struct{}) error {
	id := e.sb.ID
	r.recMu.Lock()
	if err := r.st.updateRecord(id, func(rec *record) { rec.Deleting = true }); err != nil {
		r.log.Warn("mark sandbox deleting", "sandbox", id, "err", err)
	}
	r.recMu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	if err := r.finishDelete(context.WithoutCancel(ctx), id); err != nil {
		r.mu.Lock()
		e.deleting = false // still there; the caller may retry
		r.mu.Unlock()
		return err
	}
	return nil
}

// finishDelete removes everything of a sandbox marked deleting, and
// leaves its tombstone.
func (r *Runtime) finishDelete(ctx context.Context, id sandbox.ID) error {
	if err := r.eng.remove(ctx, containerName(id)); err != nil {
		return fmt.Errorf("remove container of %s: %w", id, err)
	}
	// Its egress container goes after it: the sandbox never runs without
	// its rules.
	if err := r.eng.remove(ctx, egressName(id)); err != nil {
		return fmt.Errorf("remove egress container of %s: %w", id, err)
	}
	r.removeSandboxPins(id)
	if rec, err := r.st.record(id); err == nil && rec != nil {
		for _, v := range rec.OwnedVolumes {
			if user := r.subPathUser(id, v); user != "" {
				// The engine would refuse to remove a volume another
				// container mounts; it cannot see this one's sub path.
				// The volume goes with that sandbox instead.
				vol := v
				err := r.updateRecord(user, func(*entry) (func(*record), error) {
					return func(rec *record) { rec.OwnedVolumes = append(rec.OwnedVolumes, vol) }, nil
				})
				r.log.Info("the volume of a deleted sandbox goes with another that mounts a sub path of it", "sandbox", id, "volume", v, "to", user, "err", err)
				continue
			}
			if err := r.eng.removeVolume(ctx, v); err != nil {
				r.log.Warn("remove volume of deleted sandbox", "sandbox", id, "volume", v, "err", err)
			}
		}
	}
	r.events.flush() // so that no queued event recreates its log
	if err := r.st.bury(id); err != nil {
		return fmt.Errorf("forget sandbox %s: %w", id, err)
	}
	r.mu.Lock()
	delete(r.byID, id)
	r.mu.Unlock()
	r.log.Info("sandbox deleted", "sandbox", id)
	return nil
}

// Endpoint says how to reach port, in the forms of the protocol's Docker
// bridge rows (see bridgeEndpoint). Right after Create it waits, within
// ctx, until the container's ports are known.
func (r *Runtime) Endpoint(ctx context.Context, id sandbox.ID, port int) (sandbox.Endpoint, error) {
	if port < 1 || port > 65535 {
		return sandbox.Endpoint{}, sandbox.Coded(sandbox.ErrInvalid, api.CodeDockerInvalidPort, fmt.Sprintf("port %d is not in 1..65535", port))
	}
	r.mu.Lock()
	e, err := r.getLocked(id)
	r.mu.Unlock()
	if err != nil {
		return sandbox.Endpoint{}, err
	}
	select {
	case <-e.portsKnown:
	case <-ctx.Done():
		return sandbox.Endpoint{}, fmt.Errorf("sandbox %s is still starting: %w", id, sandbox.ErrUnavailable)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, err = r.getLocked(id); err != nil { // deleted while waiting
		return sandbox.Endpoint{}, err
	}
	if _, ok := e.ports[api.ExecdPort]; !ok {
		st := e.sb.Status
		return sandbox.Endpoint{}, sandbox.Coded(sandbox.ErrConflict, api.CodeDockerNetworkModeEndpointUnavailable,
			fmt.Sprintf("sandbox %s has no published ports (%s: %s)", id, st.State, st.Message))
	}
	if port == sandbox.PortEgress {
		if ep, ok := r.egressEndpoint(e.ports, e.egressToken); ok {
			return ep, nil
		}
	}
	return bridgeEndpoint(r.cfg.PublicHost, e.ports, e.token, e.sb.SecureAccess, port), nil
}

// bridgeEndpoint is the endpoint of port of a sandbox on a bridge network
// whose published ports are ports (execd's among them), reached at
// publicHost, with execd token token. The app port (8080) is published
// and reached directly, unless the sandbox has secure access; every other
// port, execd's own included, is {publicHost}:{execd's host port}/proxy/{port}
// with the token: execd forwards /proxy/{port} to the port and serves
// /proxy/{its own port} itself. Clients check that an endpoint is for the
// port they asked (host:port, or a path ending in /port), so even execd's
// endpoint carries the prefix.
func bridgeEndpoint(publicHost string, ports map[int]string, token string, secure bool, port int) sandbox.Endpoint {
	if port == sandbox.PortApp && !secure {
		if app, ok := ports[sandbox.PortApp]; ok {
			return sandbox.Endpoint{Address: publicAddr(publicHost, app)}
		}
	}
	return sandbox.Endpoint{
		Address: publicAddr(publicHost, ports[api.ExecdPort]) + "/proxy/" + strconv.Itoa(port),
		Headers: map[string]string{sandbox.HeaderExecdToken: token},
	}
}

// publicAddr puts publicHost in front of a published port's host address.
func publicAddr(publicHost, hostAddr string) string {
	_, port := splitHostPort(hostAddr)
	return joinHostPort(publicHost, port)
}

// SetExpiry records a new expiry.
func (r *Runtime) SetExpiry(ctx context.Context, id sandbox.ID, at *time.Time) error {
	return r.updateRecord(id, func(e *entry) (func(*record), error) {
		if e == nil {
			return nil, fmt.Errorf("sandbox %s: %w", id, sandbox.ErrNotFound)
		}
		e.sb.ExpiresAt = at
		return func(rec *record) { rec.ExpiresAt = at }, nil
	})
}

// PatchMetadata applies a merge patch to the metadata and records it.
func (r *Runtime) PatchMetadata(ctx context.Context, id sandbox.ID, patch map[string]*string) (*sandbox.Sandbox, error) {
	var sb *sandbox.Sandbox
	err := r.updateRecord(id, func(e *entry) (func(*record), error) {
		if e == nil {
			return nil, fmt.Errorf("sandbox %s: %w", id, sandbox.ErrNotFound)
		}
		md := maps.Clone(e.sb.Metadata)
		if md == nil {
			md = map[string]string{}
		}
		for k, v := range patch {
			if v == nil {
				delete(md, k)
			} else {
				md[k] = *v
			}
		}
		e.sb.Metadata = md
		sb = cloneSandbox(&e.sb)
		stored := maps.Clone(md)
		return func(rec *record) { rec.Metadata = stored }, nil
	})
	return sb, err
}

// Pause freezes the container (cgroup freezer): its processes and memory
// stay as they are. It returns once the container is paused.
func (r *Runtime) Pause(ctx context.Context, id sandbox.ID) error {
	return r.pauseOrResume(ctx, id, true)
}

// Resume thaws a paused container.
func (r *Runtime) Resume(ctx context.Context, id sandbox.ID) error {
	return r.pauseOrResume(ctx, id, false)
}

func (r *Runtime) pauseOrResume(ctx context.Context, id sandbox.ID, pause bool) error {
	from, to, reason, code, verb, op := sandbox.StateRunning, sandbox.StatePaused, "CONTAINER_PAUSED", api.CodeDockerSandboxNotRunning, "pause", r.eng.pause
	if !pause {
		from, to, reason, code, verb, op = sandbox.StatePaused, sandbox.StateRunning, "CONTAINER_RUNNING", api.CodeDockerSandboxNotPaused, "resume", r.eng.unpause
	}
	r.mu.Lock()
	e, err := r.getLocked(id)
	if err == nil && e.sb.Status.State != from {
		err = sandbox.Coded(sandbox.ErrConflict, code, fmt.Sprintf("sandbox %s is %s, not %s", id, e.sb.Status.State, from))
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	if err := op(ctx, containerName(id)); err != nil {
		if errors.Is(err, errNoSuchObject) {
			return fmt.Errorf("sandbox %s: %w", id, sandbox.ErrNotFound)
		}
		return fmt.Errorf("%s sandbox %s: %w", verb, id, err)
	}
	r.mu.Lock()
	r.transitionLocked(e, to, reason, "")
	r.mu.Unlock()
	return nil
}
