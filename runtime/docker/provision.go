package docker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/sandbox"
)

// failure is a provisioning step that failed, with the reason code and a
// message that tells the user what to do.
type failure struct {
	reason string
	msg    string
}

func (f *failure) Error() string { return f.reason + ": " + f.msg }

// startProvision runs provision for e in the background.
func (r *Runtime) startProvision(e *entry, spec sandbox.Spec) {
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	r.mu.Lock()
	e.cancel, e.done = cancel, done
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(done)
		defer cancel()
		r.provision(ctx, e, spec)
	}()
}

// provision brings a Pending sandbox to Running: image, container, start,
// published ports, and execd answering. Each step first looks at what is
// already there, so a create interrupted by a restart resumes where it
// stopped. On failure the sandbox becomes Failed with the reason, and
// its container, if one was made, is removed: nothing half-made stays.
func (r *Runtime) provision(ctx context.Context, e *entry, spec sandbox.Spec) {
	id := e.sb.ID
	err := r.provisionSteps(ctx, e, &spec)
	if ctx.Err() != nil {
		return // deleted, or the runtime is closing
	}
	if err == nil {
		return
	}
	var f *failure
	if !errors.As(err, &f) {
		f = &failure{reason: "PROVISIONING_ERROR", msg: err.Error()}
	}
	r.log.Warn("sandbox failed to start", "sandbox", id, "reason", f.reason, "err", f.msg)
	cleanup := context.WithoutCancel(ctx)
	if rerr := r.eng.remove(cleanup, containerName(id)); rerr != nil {
		r.log.Error("remove container of failed sandbox", "sandbox", id, "err", rerr)
	}
	status := sandbox.Status{State: sandbox.StateFailed, Reason: f.reason, Message: f.msg, Since: time.Now().UTC()}
	if err := r.st.updateRecord(id, func(rec *record) { rec.Failure, rec.Spec = &status, nil }); err != nil {
		r.log.Error("record failure", "sandbox", id, "err", err)
	}
	r.mu.Lock()
	r.transitionLocked(e, sandbox.StateFailed, f.reason, f.msg)
	r.mu.Unlock()
	e.markPortsKnown()
}

func (r *Runtime) provisionSteps(ctx context.Context, e *entry, spec *sandbox.Spec) error {
	id := e.sb.ID
	info, err := r.eng.inspect(ctx, containerName(id))
	if errors.Is(err, errNoSuchObject) {
		info, err = r.createContainer(ctx, e, spec)
	}
	var f *failure
	if errors.As(err, &f) {
		return f
	} else if err != nil {
		return &failure{"CONTAINER_CREATE_FAILED", fmt.Sprintf("inspect the new container: %v", err)}
	}
	if info.State != "running" && info.State != "paused" {
		if err := r.eng.start(ctx, info.ID); err != nil {
			return &failure{"CONTAINER_START_FAILED", fmt.Sprintf("the container did not start: %v", err)}
		}
		if info, err = r.eng.inspect(ctx, info.ID); err != nil {
			return &failure{"CONTAINER_START_FAILED", err.Error()}
		}
	}
	r.mu.Lock()
	e.ports = info.Ports
	r.mu.Unlock()
	e.markPortsKnown()
	execd, ok := info.Ports[sandbox.PortExecd]
	if !ok {
		return &failure{"CONTAINER_START_FAILED", "execd's port was not published"}
	}
	r.mu.Lock()
	r.transitionLocked(e, sandbox.StatePending, "CONTAINER_STARTING", "")
	r.mu.Unlock()
	if err := r.waitExecd(ctx, execd, e.token, info.ID); err != nil {
		return err
	}
	if err := r.st.updateRecord(id, func(rec *record) { rec.Spec = nil }); err != nil {
		r.log.Warn("record sandbox running", "sandbox", id, "err", err)
	}
	r.mu.Lock()
	if info.State == "paused" {
		r.transitionLocked(e, sandbox.StatePaused, "CONTAINER_PAUSED", "")
	} else {
		r.transitionLocked(e, sandbox.StateRunning, "CONTAINER_RUNNING", "")
	}
	r.mu.Unlock()
	r.log.Info("sandbox running", "sandbox", id, "image", spec.Image)
	return nil
}

// createContainer makes the sandbox's container: image, named volumes,
// then the container itself.
func (r *Runtime) createContainer(ctx context.Context, e *entry, spec *sandbox.Spec) (containerInfo, error) {
	id := e.sb.ID
	if err := r.ensureImage(ctx, e, spec); err != nil {
		return containerInfo{}, err
	}
	if err := r.ensureVolumes(ctx, id, spec.Volumes); err != nil {
		return containerInfo{}, err
	}
	cc, hc, platform, err := containerConfig(&r.cfg, id, spec, e.sb.CreatedAt, r.tokenFile(id))
	if err != nil {
		return containerInfo{}, &failure{"INVALID_CONFIGURATION", err.Error()}
	}
	if _, err := r.eng.create(ctx, containerName(id), cc, hc, platform); err != nil && !errors.Is(err, errNameConflict) {
		return containerInfo{}, &failure{"CONTAINER_CREATE_FAILED", fmt.Sprintf("the engine refused the container: %v", err)}
	}
	return r.eng.inspect(ctx, containerName(id))
}

// ensureImage makes spec's image available: pulled per the pull policy,
// with the request's credentials; concurrent pulls of one image are one
// pull.
func (r *Runtime) ensureImage(ctx context.Context, e *entry, spec *sandbox.Spec) error {
	ref := spec.Image
	if r.cfg.PullPolicy != "always" {
		ok, err := r.eng.imageExists(ctx, ref)
		if err != nil {
			return &failure{"IMAGE_PULL_FAILED", err.Error()}
		}
		if ok {
			return nil
		}
		if r.cfg.PullPolicy == "never" {
			return &failure{"IMAGE_NOT_FOUND", fmt.Sprintf("image %s is not on this host, and the server's pull_policy is never: load it first", ref)}
		}
	}
	r.mu.Lock()
	r.transitionLocked(e, sandbox.StatePending, "PULLING_IMAGE", ref)
	r.mu.Unlock()
	var user, pass string
	if spec.ImageAuth != nil {
		user, pass = spec.ImageAuth.Username, spec.ImageAuth.Password
	}
	// Callers with different credentials must not share a pull: one of
	// them could be refused what the other may see.
	key := ref + "\x00" + user + "\x00" + pass
	ch := r.pulls.DoChan(key, func() (any, error) {
		// The pull runs in the runtime's context: it is shared, and must
		// not die with the first caller's request.
		start := time.Now()
		err := r.eng.pull(r.ctx, ref, user, pass, nil)
		if err != nil {
			r.log.Warn("image pull failed", "image", ref, "duration", time.Since(start), "err", err)
		} else {
			r.log.Info("image pulled", "image", ref, "duration", time.Since(start))
		}
		return nil, err
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return &failure{"IMAGE_PULL_FAILED", fmt.Sprintf("pull %s: %v", ref, res.Err)}
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkVolumes refuses, before anything is made, a named volume that
// does not exist and may not be created.
func (r *Runtime) checkVolumes(ctx context.Context, vols []sandbox.Volume) error {
	for _, v := range vols {
		if v.Claim == nil || v.Claim.CreateIfNotExists {
			continue
		}
		_, ok, err := r.eng.volumeExists(ctx, v.Claim.Name)
		if err != nil {
			return fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
		}
		if !ok {
			return sandbox.Coded(sandbox.ErrNotFound, "VOLUME::PVC_NOT_FOUND",
				fmt.Sprintf("volume %s: named volume %s does not exist and createIfNotExists is false", v.Name, v.Claim.Name))
		}
	}
	return nil
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
			r.st.updateRecord(id, func(rec *record) { rec.OwnedVolumes = append(rec.OwnedVolumes, v.Claim.Name) })
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
	host, port := splitHostPort(hostAddr)
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	url := "http://" + joinHostPort(host, port) + "/ping"
	deadline := time.Now().Add(r.cfg.StartTimeout)
	delay := 5 * time.Millisecond
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
			return &failure{"EXECD_NOT_READY", fmt.Sprintf("execd did not answer within %v (%v); see the sandbox's logs", r.cfg.StartTimeout, last)}
		}
		if n%20 == 19 {
			// Now and then, check that the container still runs.
			if info, err := r.eng.inspect(ctx, containerID); err == nil && info.State != "running" && info.State != "paused" {
				msg := fmt.Sprintf("the container stopped (%s, exit code %d) before execd answered", info.State, info.ExitCode)
				if info.Error != "" {
					msg += ": " + info.Error
				}
				return &failure{"CONTAINER_EXITED_ERROR", msg}
			}
		}
		time.Sleep(delay)
		delay = min(delay*2, 100*time.Millisecond)
	}
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
