package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/warmpool"
	"github.com/opensandbox/opensandbox/sandbox"
)

// failure is a provisioning step that failed, with the reason code and a
// message that tells the user what to do.
type failure struct {
	reason string
	msg    string
}

func (f *failure) Error() string { return f.reason + ": " + f.msg }

// prepareProvisionLocked marks e as being provisioned and returns the
// context the provisioning runs in. r.mu must be held.
func (r *Runtime) prepareProvisionLocked(e *entry) context.Context {
	ctx, cancel := context.WithCancel(r.ctx)
	e.cancel, e.done = cancel, make(chan struct{})
	return ctx
}

// runProvision provisions e in the background, in ctx from
// prepareProvisionLocked.
func (r *Runtime) runProvision(ctx context.Context, e *entry, spec sandbox.Spec) {
	r.mu.Lock()
	cancel, done := e.cancel, e.done
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(done)
		defer cancel()
		defer e.markPortsKnown() // whatever happens, nobody waits for ever
		r.provision(ctx, e, spec)
	}()
}

// provision brings a Pending sandbox to Running: image, container, start,
// published ports, and execd answering. Each step first looks at what is
// already there, so a create interrupted by a restart resumes where it
// stopped. On failure the sandbox becomes Failed with the reason; its
// container, if one was made, is stopped but kept, so that its logs tell
// what happened, until the sandbox is deleted.
func (r *Runtime) provision(ctx context.Context, e *entry, spec sandbox.Spec) {
	err := r.provisionSteps(ctx, e, &spec)
	if err == nil || ctx.Err() != nil {
		return // running, or deleted, or the runtime is closing
	}
	var f *failure
	if !errors.As(err, &f) {
		f = &failure{reason: "PROVISIONING_ERROR", msg: err.Error()}
	}
	r.failStarted(context.WithoutCancel(ctx), e, f)
}

// failStarted records as Failed a sandbox whose container may exist: the
// container is stopped but kept, and the last lines of its log join the
// message.
func (r *Runtime) failStarted(ctx context.Context, e *entry, f *failure) {
	id := e.sb.ID
	if err := r.eng.kill(ctx, containerName(id)); err != nil && !errors.Is(err, errNoSuchObject) {
		r.log.Warn("stop container of failed sandbox", "sandbox", id, "err", err)
	}
	if logs, err := r.eng.logs(ctx, containerName(id), 5, time.Time{}); err == nil && strings.TrimSpace(logs) != "" {
		f.msg += "; last lines of its log:\n" + strings.TrimRight(logs, "\n")
	}
	r.log.Warn("sandbox failed to start", "sandbox", id, "reason", f.reason, "err", f.msg)
	r.fail(e, f.reason, f.msg)
}

// fail records a sandbox as Failed, in the index and the store.
func (r *Runtime) fail(e *entry, reason, msg string) {
	status := sandbox.Status{State: sandbox.StateFailed, Reason: reason, Message: msg, Since: time.Now().UTC()}
	err := r.updateRecord(e.sb.ID, func(cur *entry) (func(*record), error) {
		if cur != nil {
			r.transitionLocked(cur, sandbox.StateFailed, reason, msg)
		}
		return func(rec *record) { rec.Failure, rec.Spec = &status, nil }, nil
	})
	if err != nil {
		r.log.Error("record failure", "sandbox", e.sb.ID, "err", err)
	}
	e.markPortsKnown()
}

func (r *Runtime) provisionSteps(ctx context.Context, e *entry, spec *sandbox.Spec) error {
	id := e.sb.ID
	var info containerInfo
	var err error
	created := false
	if e.fresh {
		// Made in this process a moment ago: there is no container to
		// find, and one engine call fewer is a few milliseconds less.
		info, err = r.createContainer(ctx, e, spec)
		created = true
	} else {
		info, err = r.eng.inspect(ctx, containerName(id))
		if errors.Is(err, errNoSuchObject) {
			info, err = r.createContainer(ctx, e, spec)
			created = true
		}
	}
	var f *failure
	if errors.As(err, &f) || ctx.Err() != nil {
		return err
	} else if err != nil {
		return &failure{"CONTAINER_CREATE_FAILED", fmt.Sprintf("inspect the new container: %v", err)}
	}
	if info.State != "running" && info.State != "paused" {
		if eg := info.Labels[labelEgress]; eg != "" && !created {
			// Its namespace's owner must run before it can start.
			if err := r.restartEgress(ctx, eg); err != nil {
				return err
			}
			if info.State == "created" && slices.Contains(info.Env, sandbox.CredentialCAEnv()[0]) {
				// Made before a restart of the server, perhaps without
				// its CA yet.
				if err := r.installCredentialCA(ctx, id, info.ID); err != nil {
					return err
				}
			}
		}
		if info, err = r.startContainer(ctx, id, info.ID, spec.Volumes, !created); err != nil {
			return err
		}
	}
	r.mu.Lock()
	e.ports = info.Ports
	r.transitionLocked(e, sandbox.StatePending, "CONTAINER_STARTING", "")
	r.mu.Unlock()
	e.markPortsKnown()
	r.disk.started(id, info) // its storage limit holds from its first write
	execd, ok := info.Ports[api.ExecdPort]
	if !ok {
		return &failure{"CONTAINER_START_FAILED", "execd's port was not published"}
	}
	r.mu.Lock()
	token, heldStart := e.token, e.heldStart
	r.mu.Unlock()
	if err := r.waitExecd(ctx, execd, token, info.ID); err != nil {
		return err
	}
	handed := ""
	if isHeld(info.Labels) && info.State == "running" && info.StartedAt != heldStart {
		if err := r.handOverEntrypoint(ctx, id, info, execd, token); err != nil {
			return err
		}
		handed = info.StartedAt
	}
	if info.State == "running" {
		if err := checkEntrypoint(ctx, execd, token); err != nil {
			return err
		}
	}
	state, reason := sandbox.StateRunning, "CONTAINER_RUNNING"
	if info.State == "paused" {
		state, reason = sandbox.StatePaused, "CONTAINER_PAUSED"
	}
	if state == sandbox.StateRunning && !e.requested.IsZero() {
		// Reported before anyone can see it Running, so that whoever sees
		// it finds it counted.
		r.cfg.Observer.SandboxReady(sandbox.CreateCold, time.Since(e.requested))
	}
	err = r.updateRecord(id, func(cur *entry) (func(*record), error) {
		if cur != nil {
			r.transitionLocked(cur, state, reason, "")
			if handed != "" {
				cur.heldStart = handed
			}
		}
		return func(rec *record) {
			// Running, again if its container stopped and started since.
			rec.Spec, rec.Failure = nil, nil
			if handed != "" {
				rec.HeldStart = handed
			}
		}, nil
	})
	if err != nil {
		r.log.Warn("record sandbox running", "sandbox", id, "err", err)
	}
	r.log.Info("sandbox running", "sandbox", id, "image", spec.Image)
	return nil
}

// startContainer starts the container cid of sandbox id and inspects it.
// The pins of its volumes are made again first when repin is set (a
// container made before a restart: its pins may be gone, or stale), and
// released once the engine has mounted them: the running container holds
// its own mounts, and no host directory stays mounted on the host.
func (r *Runtime) startContainer(ctx context.Context, id sandbox.ID, cid string, vols []sandbox.Volume, repin bool) (containerInfo, error) {
	if needsPins(vols) {
		defer r.releasePins(id)
		if repin {
			if err := r.pinVolumes(ctx, id, vols); err != nil {
				return containerInfo{}, err
			}
		}
	}
	if err := r.eng.start(ctx, cid); err != nil {
		return containerInfo{}, &failure{"CONTAINER_START_FAILED", fmt.Sprintf("the container did not start: %v", err)}
	}
	info, err := r.eng.inspect(ctx, cid)
	if err != nil {
		return containerInfo{}, &failure{"CONTAINER_START_FAILED", err.Error()}
	}
	return info, nil
}

// createContainer makes the sandbox's container: image, named volumes,
// then the container itself. The engine call that makes the container is
// not cancelled with ctx, since the engine finishes it anyway: a delete
// that arrives meanwhile finds the container made, and removes it.
func (r *Runtime) createContainer(ctx context.Context, e *entry, spec *sandbox.Spec) (_ containerInfo, retErr error) {
	id := e.sb.ID
	if err := r.ensureImage(ctx, e, spec); err != nil {
		return containerInfo{}, err
	}
	if err := r.ensureVolumes(ctx, id, spec.Volumes); err != nil {
		return containerInfo{}, err
	}
	// Pinned now, since the engine wants a bind's source to exist when
	// it makes the container; released once the container started, or
	// at once if anything fails (the pins made before a failed one too).
	if needsPins(spec.Volumes) {
		defer func() {
			if retErr != nil {
				r.releasePins(id)
			}
		}()
	}
	if err := r.pinVolumes(ctx, id, spec.Volumes); err != nil {
		return containerInfo{}, err
	}
	r.mu.Lock()
	token, pool, egressToken := e.token, e.pool, e.egressToken
	r.mu.Unlock()
	cc, hc, platform, err := containerConfig(&r.cfg, id, spec, e.sb.CreatedAt, token, pool)
	if err != nil {
		return containerInfo{}, &failure{"INVALID_CONFIGURATION", err.Error()}
	}
	var started chan error // osb-egress enforcing, or why not
	if hasEgress(spec) {
		// The sandbox's container is made while osb-egress starts (it
		// needs the egress container to exist, not to run), and is
		// returned only once osb-egress enforces: it starts after that.
		if err := r.makeEgress(ctx, e, spec, egressToken); err != nil {
			return containerInfo{}, err
		}
		started = make(chan error, 1)
		go func() { started <- r.restartEgress(ctx, egressName(id)) }()
		defer func() {
			if started == nil {
				return // waited for below
			}
			if err := <-started; err != nil && retErr == nil {
				retErr = err
			}
		}()
	}
	if ctx.Err() != nil {
		return containerInfo{}, ctx.Err()
	}
	cid, err := r.eng.create(context.WithoutCancel(ctx), containerName(id), cc, hc, platform)
	if err != nil && hc.StorageOpt != nil && isStorageOptRefusal(err) && r.cfg.storage.engineQuota.CompareAndSwap(true, false) {
		// xfs without project quotas: the server measures instead.
		r.log.Warn("the engine cannot bound writable layers after all; storage limits are now measured by the server", "mode", r.cfg.storage.mode(), "err", err)
	}
	if err != nil && hc.StorageOpt != nil && isStorageOptRefusal(err) {
		if cc, hc, platform, err = containerConfig(&r.cfg, id, spec, e.sb.CreatedAt, token, pool); err != nil {
			return containerInfo{}, &failure{"INVALID_CONFIGURATION", err.Error()}
		}
		cid, err = r.eng.create(context.WithoutCancel(ctx), containerName(id), cc, hc, platform)
	}
	if errors.Is(err, errNoSuchObject) && strings.Contains(err.Error(), "image") {
		// The image was known here and has gone since: look again (pull it
		// per the policy), then make the container.
		r.seenImages.Delete(spec.Image)
		if err := r.ensureImage(ctx, e, spec); err != nil {
			return containerInfo{}, err
		}
		cid, err = r.eng.create(context.WithoutCancel(ctx), containerName(id), cc, hc, platform)
	}
	if err != nil && !errors.Is(err, errNameConflict) {
		return containerInfo{}, &failure{"CONTAINER_CREATE_FAILED", fmt.Sprintf("the engine refused the container: %v", err)}
	}
	info := containerInfo{ID: cid, State: "created"}
	if err != nil {
		if info, err = r.eng.inspect(ctx, containerName(id)); err != nil {
			return info, err
		}
	}
	if spec.CredentialProxy && info.State == "created" {
		// The CA exists once osb-egress enforces; the container must
		// trust it from its first process on.
		err, started = <-started, nil
		if err != nil {
			return containerInfo{}, err
		}
		if err := r.installCredentialCA(ctx, id, info.ID); err != nil {
			return containerInfo{}, err
		}
	}
	// Just made: created, not started, no ports yet. The inspect after the
	// start tells the rest.
	return info, nil
}

// ensureImage makes spec's image available: pulled per the pull policy,
// with the request's credentials; concurrent pulls of one image are one
// pull.
func (r *Runtime) ensureImage(ctx context.Context, e *entry, spec *sandbox.Spec) error {
	ref := spec.Image
	if r.cfg.PullPolicy != "always" {
		if at, ok := r.seenImages.Load(ref); ok && time.Since(at.(time.Time)) < imageSeenFor {
			// Found a moment ago: one engine call fewer. Should it have
			// gone since, the create says so and the image is looked at
			// again (see createContainer).
			return nil
		}
		ok, err := r.eng.imageExists(ctx, ref)
		if err != nil {
			return &failure{"IMAGE_PULL_FAILED", err.Error()}
		}
		if ok {
			r.seenImages.Store(ref, time.Now())
			return nil
		}
		if r.cfg.PullPolicy == "never" {
			return &failure{"IMAGE_NOT_FOUND", fmt.Sprintf("image %s is not on this host, and the server's pull_policy is never: load it first", ref)}
		}
	}
	r.mu.Lock()
	r.transitionLocked(e, sandbox.StatePending, "PULLING_IMAGE", ref)
	r.mu.Unlock()
	var auth sandbox.RegistryAuth
	if spec.ImageAuth != nil {
		auth = *spec.ImageAuth
	}
	if err := r.pulls.pull(ctx, ref, auth); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &failure{"IMAGE_PULL_FAILED", fmt.Sprintf("pull %s: %v", ref, err)}
	}
	return nil
}

// imageSeenFor is how long an image found on the engine is taken to be
// there without asking again.
const imageSeenFor = time.Minute

// pulls runs image pulls, one per image and credentials at a time:
// callers asking for a pull already under way wait for it. A pull is
// cancelled when every caller waiting for it has gone, and after a
// timeout.
type pulls struct {
	eng     *engine
	log     *slog.Logger
	timeout time.Duration
	obs     sandbox.Observer

	mu       sync.Mutex
	inflight map[string]*pullOp
}

type pullOp struct {
	done    chan struct{}
	err     error
	waiters int
	cancel  context.CancelFunc
}

func newPulls(eng *engine, log *slog.Logger, timeout time.Duration, obs sandbox.Observer) *pulls {
	return &pulls{eng: eng, log: log, timeout: timeout, obs: obs, inflight: map[string]*pullOp{}}
}

func (p *pulls) pull(ctx context.Context, ref string, auth sandbox.RegistryAuth) error {
	// Callers with different credentials never share a pull: one of them
	// could be refused what the other may see.
	key := ref + "\x00" + auth.Username + "\x00" + auth.Password
	p.mu.Lock()
	op := p.inflight[key]
	if op == nil {
		pctx, cancel := context.WithTimeout(context.Background(), p.timeout)
		op = &pullOp{done: make(chan struct{}), cancel: cancel}
		p.inflight[key] = op
		go func() {
			start := time.Now()
			err := p.eng.pull(pctx, ref, auth.Username, auth.Password, nil)
			switch {
			case errors.Is(pctx.Err(), context.DeadlineExceeded):
				err = fmt.Errorf("no answer within %v (runtime.docker.pull_timeout): %w", p.timeout, err)
			case err != nil && errors.Is(pctx.Err(), context.Canceled) && !errors.Is(err, context.Canceled):
				// Whatever the engine said, the pull stopped because every
				// caller gave up.
				err = fmt.Errorf("%w: %w", context.Canceled, err)
			}
			cancel()
			d := time.Since(start)
			if err != nil {
				p.log.Warn("image pull failed", "image", ref, "duration", d, "err", err)
			} else {
				p.log.Info("image pulled", "image", ref, "duration", d)
			}
			p.obs.ImagePulled(ref, d, err)
			p.mu.Lock()
			op.err = err
			delete(p.inflight, key)
			p.mu.Unlock()
			close(op.done)
		}()
	}
	op.waiters++
	p.mu.Unlock()
	select {
	case <-op.done:
		return op.err
	case <-ctx.Done():
		p.mu.Lock()
		op.waiters--
		if op.waiters == 0 {
			op.cancel() // nobody wants this image any more
		}
		p.mu.Unlock()
		return ctx.Err()
	}
}

// checkVolumes refuses, before anything is made, named volumes the
// sandbox may not use: one that does not exist and may not be created,
// and one that exists but belongs neither to this server's scope nor to
// the configured allowlist.
func (r *Runtime) checkVolumes(ctx context.Context, vols []sandbox.Volume) error {
	for _, v := range vols {
		if v.Claim == nil {
			continue
		}
		labels, ok, err := r.eng.volumeExists(ctx, v.Claim.Name)
		if err != nil {
			return fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
		}
		switch {
		case !ok && !v.Claim.CreateIfNotExists:
			return sandbox.Coded(sandbox.ErrNotFound, api.CodeVolumePVCNotFound,
				fmt.Sprintf("volume %s: named volume %s does not exist and createIfNotExists is false", v.Name, v.Claim.Name))
		case ok && labels[labelScope] != r.cfg.LabelScope && !r.volumeAllowed(v.Claim.Name):
			return sandbox.Coded(sandbox.ErrInvalid, api.CodeVolumeNotAllowed,
				fmt.Sprintf("volume %s: named volume %s exists but was not made by this server; allow it with runtime.docker.named_volume_allowlist", v.Name, v.Claim.Name))
		case ok && v.SubPath != "":
			vi, err := r.eng.volumeInfo(ctx, v.Claim.Name)
			if err != nil {
				return fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
			}
			if err := subPathVolumeOK(vi); err != nil {
				return sandbox.Coded(sandbox.ErrInvalid, api.CodeVolumePVCSubPathUnsupportedDriver, fmt.Sprintf("volume %s: %v", v.Name, err))
			}
		}
	}
	return nil
}

func (r *Runtime) volumeAllowed(name string) bool {
	return slices.ContainsFunc(r.cfg.NamedVolumeAllowlist, func(prefix string) bool { return strings.HasPrefix(name, prefix) })
}

// ensureVolumes creates the named volumes a sandbox asks for, recording
// those that go with it.
func (r *Runtime) ensureVolumes(ctx context.Context, id sandbox.ID, vols []sandbox.Volume) error {
	for _, v := range vols {
		if v.Claim == nil {
			continue
		}
		_, ok, err := r.eng.volumeExists(ctx, v.Claim.Name)
		if err != nil {
			return &failure{"VOLUME_FAILED", err.Error()}
		}
		if ok {
			continue
		}
		if !v.Claim.CreateIfNotExists {
			return &failure{"VOLUME_NOT_FOUND", fmt.Sprintf("named volume %s does not exist", v.Claim.Name)}
		}
		if err := r.eng.createVolume(ctx, v.Claim.Name, map[string]string{labelScope: r.cfg.LabelScope, labelVolumeOwner: string(id)}); err != nil {
			return &failure{"VOLUME_FAILED", fmt.Sprintf("create volume %s: %v", v.Claim.Name, err)}
		}
		if v.Claim.DeleteOnTermination {
			name := v.Claim.Name
			if err := r.updateRecord(id, func(*entry) (func(*record), error) {
				return func(rec *record) { rec.OwnedVolumes = append(rec.OwnedVolumes, name) }, nil
			}); err != nil {
				return &failure{"VOLUME_FAILED", err.Error()}
			}
		}
	}
	return nil
}

// probeClient checks execd's readiness; it never goes through a proxy.
var probeClient = &http.Client{
	Timeout:   2 * time.Second,
	Transport: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: time.Second}).DialContext, DisableKeepAlives: true},
}

// waitExecd polls execd's /ping through its published port until it
// answers, the container stops, or StartTimeout passes.
func (r *Runtime) waitExecd(ctx context.Context, hostAddr, token, containerID string) error {
	url := execdURL(hostAddr) + "/ping"
	deadline := time.Now().Add(r.cfg.StartTimeout)
	// execd answers a few milliseconds after its container starts: poll
	// every 2 ms for the first 100 ms, so that no create waits for a
	// coarse poll, then back off.
	delay := 2 * time.Millisecond
	var last error
	for n := 0; ; n++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set(sandbox.HeaderExecdToken, token)
		resp, err := probeClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/ping answered %s", resp.Status)
		}
		last = err
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return &failure{"EXECD_NOT_READY", fmt.Sprintf("execd did not answer within %v (%v)", r.cfg.StartTimeout, last)}
		}
		if n%20 == 19 {
			// Now and then, check that the container still runs.
			if info, err := r.eng.inspect(ctx, containerID); err == nil && info.State != "running" && info.State != "paused" {
				msg := fmt.Sprintf("the container stopped (%s, exit code %d) before execd answered", info.State, info.ExitCode)
				if info.OOMKilled {
					msg = "the container ran out of memory before execd answered"
				}
				if info.Error != "" {
					msg += ": " + info.Error
				}
				return &failure{"CONTAINER_EXITED_ERROR", msg}
			}
		}
		time.Sleep(delay)
		if n >= 50 {
			delay = min(delay*2, 100*time.Millisecond)
		}
	}
}

// checkEntrypoint asks execd, published at hostAddr, whether the
// sandbox's entrypoint could start (warmpool.CheckEntrypoint), and answers
// a failure with reason api.ReasonEntrypointFailed when it could not
// (missing, not executable, not a valid executable), or EXECD_NOT_READY
// when execd could not be asked.
func checkEntrypoint(ctx context.Context, hostAddr, token string) error {
	err := warmpool.CheckEntrypoint(ctx, probeClient, execdURL(hostAddr), token)
	var ee *warmpool.EntrypointError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee):
		return &failure{api.ReasonEntrypointFailed, ee.Error()}
	}
	return &failure{"EXECD_NOT_READY", err.Error()}
}

// execdURL is the base URL at which the server reaches a sandbox's execd
// published at hostAddr: a port published on every address is reached on
// loopback.
func execdURL(hostAddr string) string {
	host, port := splitHostPort(hostAddr)
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + joinHostPort(host, port)
}

func splitHostPort(addr string) (host, port string) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, ""
	}
	return h, p
}

func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}
