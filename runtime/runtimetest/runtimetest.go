// Package runtimetest is the conformance suite every sandbox.Runtime runs
// from its own tests: the fake, Docker and Kubernetes runtimes are held to
// the same behaviour. Only tests import it.
package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Options describe the runtime under test.
type Options struct {
	// Image starts a sandbox; Entrypoint keeps it running.
	Image      string
	Entrypoint []string
	// MissingImage is a reference that cannot be pulled, without
	// sending anything off this machine (e.g. a registry on a closed
	// loopback port).
	MissingImage string
	// Reach, when set, proves that an execd endpoint of a Running sandbox
	// is real; ReachExecd is the usual choice.
	Reach func(t *testing.T, ep sandbox.Endpoint)
	// StartTimeout bounds how long a sandbox may stay Pending. Default 60 s.
	StartTimeout time.Duration
}

// Run runs the suite. newRuntime returns a fresh runtime for one subtest
// and arranges its cleanup.
func Run(t *testing.T, newRuntime func(t *testing.T) sandbox.Runtime, opts Options) {
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	s := &suite{new: newRuntime, opts: opts}
	t.Run("Lifecycle", s.lifecycle)
	t.Run("EndpointWhileStarting", s.endpointWhileStarting)
	t.Run("ExpiryAndMetadata", s.expiryAndMetadata)
	t.Run("NotFound", s.notFound)
	t.Run("DuplicateID", s.duplicateID)
	t.Run("MissingImageFails", s.missingImage)
	t.Run("PauseResume", s.pauseResume)
	t.Run("Snapshots", s.snapshots)
	t.Run("ConcurrentCreates", s.concurrentCreates)
}

type suite struct {
	new  func(t *testing.T) sandbox.Runtime
	opts Options
}

func (s *suite) spec() sandbox.Spec {
	return sandbox.Spec{
		Image:      s.opts.Image,
		Entrypoint: s.opts.Entrypoint,
		Metadata:   map[string]string{"suite": "conformance"},
		Env:        map[string]string{"SUITE": "1"},
	}
}

// WaitState polls Get until the sandbox reaches want, failing on Failed
// (unless wanted) and after timeout.
func WaitState(t *testing.T, rt sandbox.Runtime, id sandbox.ID, want sandbox.State, timeout time.Duration) *sandbox.Sandbox {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		sb, err := rt.Get(context.Background(), id)
		if err != nil {
			t.Fatalf("Get(%s) while waiting for %s: %v", id, want, err)
		}
		if sb.Status.State == want {
			return sb
		}
		if sb.Status.State == sandbox.StateFailed {
			t.Fatalf("sandbox %s failed while waiting for %s: %s: %s", id, want, sb.Status.Reason, sb.Status.Message)
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still %s (%s) after %v, want %s", id, sb.Status.State, sb.Status.Reason, timeout, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *suite) create(t *testing.T, rt sandbox.Runtime, spec sandbox.Spec) sandbox.ID {
	t.Helper()
	id := sandbox.NewID()
	sb, err := rt.Create(context.Background(), id, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if sb.ID != id || (sb.Status.State != sandbox.StatePending && sb.Status.State != sandbox.StateRunning) {
		t.Fatalf("Create returned %+v, want id %s Pending or Running", sb, id)
	}
	return id
}

func (s *suite) lifecycle(t *testing.T) {
	rt := s.new(t)
	ctx := context.Background()
	id := s.create(t, rt, s.spec())
	sb := WaitState(t, rt, id, sandbox.StateRunning, s.opts.StartTimeout)
	if sb.Image != s.opts.Image || strings.Join(sb.Entrypoint, " ") != strings.Join(s.opts.Entrypoint, " ") ||
		sb.Metadata["suite"] != "conformance" || sb.CreatedAt.IsZero() || sb.ExpiresAt != nil {
		t.Fatalf("Running sandbox %+v does not match its spec", sb)
	}
	all, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, x := range all {
		found = found || x.ID == id
	}
	if !found {
		t.Fatalf("List does not contain %s", id)
	}
	ep, err := rt.Endpoint(ctx, id, api.ExecdPort)
	if err != nil {
		t.Fatalf("Endpoint: %v", err)
	}
	if ep.Address == "" || strings.Contains(ep.Address, "://") || ep.Headers[sandbox.HeaderExecdToken] == "" {
		t.Fatalf("execd endpoint %+v: want a scheme-less address and the token header", ep)
	}
	if s.opts.Reach != nil {
		s.opts.Reach(t, ep)
		for _, port := range []int{sandbox.PortApp, 9000} {
			other, err := rt.Endpoint(ctx, id, port)
			if err != nil || other.Address == "" {
				t.Fatalf("Endpoint(%d) = %+v, %v", port, other, err)
			}
		}
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := rt.Get(ctx, id); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	if err := rt.Delete(ctx, id); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("second Delete: %v, want ErrNotFound", err)
	}
}

func (s *suite) endpointWhileStarting(t *testing.T) {
	rt := s.new(t)
	id := s.create(t, rt, s.spec())
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.StartTimeout)
	defer cancel()
	for _, port := range []int{api.ExecdPort, sandbox.PortEgress} {
		if ep, err := rt.Endpoint(ctx, id, port); err != nil || ep.Address == "" {
			t.Fatalf("Endpoint(%d) right after Create = %+v, %v", port, ep, err)
		}
	}
	WaitState(t, rt, id, sandbox.StateRunning, s.opts.StartTimeout)
}

func (s *suite) expiryAndMetadata(t *testing.T) {
	rt := s.new(t)
	ctx := context.Background()
	spec := s.spec()
	exp := time.Now().Add(time.Hour).Truncate(time.Second).UTC()
	spec.ExpiresAt = &exp
	id := s.create(t, rt, spec)
	sb := WaitState(t, rt, id, sandbox.StateRunning, s.opts.StartTimeout)
	if sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(exp) {
		t.Fatalf("ExpiresAt = %v, want %v", sb.ExpiresAt, exp)
	}
	later := exp.Add(time.Hour)
	if err := rt.SetExpiry(ctx, id, &later); err != nil {
		t.Fatal(err)
	}
	if sb, _ = rt.Get(ctx, id); sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(later) {
		t.Fatalf("after SetExpiry: %v, want %v", sb.ExpiresAt, later)
	}
	v := "patched"
	sb, err := rt.PatchMetadata(ctx, id, map[string]*string{"suite": nil, "new": &v})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sb.Metadata["suite"]; ok || sb.Metadata["new"] != "patched" {
		t.Fatalf("metadata after patch: %v", sb.Metadata)
	}
	if sb, _ = rt.Get(ctx, id); sb.Metadata["new"] != "patched" {
		t.Fatalf("metadata after Get: %v", sb.Metadata)
	}
	rt.Delete(ctx, id)
}

func (s *suite) notFound(t *testing.T) {
	rt := s.new(t)
	ctx := context.Background()
	id := sandbox.NewID()
	checks := map[string]error{}
	_, checks["Get"] = rt.Get(ctx, id)
	checks["Delete"] = rt.Delete(ctx, id)
	_, checks["Endpoint"] = rt.Endpoint(ctx, id, api.ExecdPort)
	checks["SetExpiry"] = rt.SetExpiry(ctx, id, nil)
	_, checks["PatchMetadata"] = rt.PatchMetadata(ctx, id, nil)
	if p, ok := rt.(sandbox.Pauser); ok {
		checks["Pause"] = p.Pause(ctx, id)
		checks["Resume"] = p.Resume(ctx, id)
	}
	for op, err := range checks {
		if !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("%s of an unknown sandbox: %v, want ErrNotFound", op, err)
		}
	}
}

func (s *suite) duplicateID(t *testing.T) {
	rt := s.new(t)
	id := s.create(t, rt, s.spec())
	if _, err := rt.Create(context.Background(), id, s.spec()); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("second Create with the same id: %v, want ErrConflict", err)
	}
	WaitState(t, rt, id, sandbox.StateRunning, s.opts.StartTimeout)
	rt.Delete(context.Background(), id)
}

func (s *suite) missingImage(t *testing.T) {
	rt := s.new(t)
	spec := s.spec()
	spec.Image = s.opts.MissingImage
	id := s.create(t, rt, spec)
	deadline := time.Now().Add(s.opts.StartTimeout)
	for {
		sb, err := rt.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Status.State == sandbox.StateFailed {
			if sb.Status.Reason == "" || sb.Status.Message == "" {
				t.Fatalf("Failed without reason or message: %+v", sb.Status)
			}
			break
		}
		if sb.Status.State != sandbox.StatePending || time.Now().After(deadline) {
			t.Fatalf("sandbox of a missing image is %+v, want Pending then Failed", sb.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := rt.Delete(context.Background(), id); err != nil {
		t.Fatalf("Delete of a Failed sandbox: %v", err)
	}
}

func (s *suite) pauseResume(t *testing.T) {
	rt := s.new(t)
	p, ok := rt.(sandbox.Pauser)
	if !ok {
		t.Log("runtime does not pause")
		return
	}
	ctx := context.Background()
	id := s.create(t, rt, s.spec())
	WaitState(t, rt, id, sandbox.StateRunning, s.opts.StartTimeout)
	if err := p.Resume(ctx, id); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("Resume of a Running sandbox: %v, want ErrConflict", err)
	}
	if err := p.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if sb, _ := rt.Get(ctx, id); sb.Status.State != sandbox.StatePaused {
		t.Fatalf("after Pause: %s", sb.Status.State)
	}
	if err := p.Pause(ctx, id); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("Pause of a Paused sandbox: %v, want ErrConflict", err)
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if sb, _ := rt.Get(ctx, id); sb.Status.State != sandbox.StateRunning {
		t.Fatalf("after Resume: %s", sb.Status.State)
	}
	if s.opts.Reach != nil {
		ep, _ := rt.Endpoint(ctx, id, api.ExecdPort)
		s.opts.Reach(t, ep)
	}
	rt.Delete(ctx, id)
}

func (s *suite) snapshots(t *testing.T) {
	rt := s.new(t)
	sn, ok := rt.(sandbox.Snapshotter)
	if !ok {
		t.Log("runtime does not snapshot")
		return
	}
	ctx := context.Background()
	id := s.create(t, rt, s.spec())
	WaitState(t, rt, id, sandbox.StateRunning, s.opts.StartTimeout)
	snapID := sandbox.NewSnapshotID()
	snap, err := sn.CreateSnapshot(ctx, id, snapID, "suite")
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	if snap.ID != snapID || snap.SandboxID != id || snap.Name != "suite" || snap.State != sandbox.SnapshotCreating {
		t.Fatalf("snapshot %+v", snap)
	}
	deadline := time.Now().Add(s.opts.StartTimeout)
	for snap.State == sandbox.SnapshotCreating {
		if time.Now().After(deadline) {
			t.Fatal("snapshot still Creating")
		}
		time.Sleep(20 * time.Millisecond)
		if snap, err = sn.GetSnapshot(ctx, snapID); err != nil {
			t.Fatal(err)
		}
	}
	if snap.State != sandbox.SnapshotReady {
		t.Fatalf("snapshot ended %+v", snap)
	}
	image, err := sn.SnapshotImage(ctx, snapID)
	if err != nil || image == "" {
		t.Fatalf("SnapshotImage: %q, %v", image, err)
	}
	// A snapshot outlives its sandbox, and restores.
	rt.Delete(ctx, id)
	spec := s.spec()
	spec.Image, spec.SnapshotID = image, string(snapID)
	restored := s.create(t, rt, spec)
	sb := WaitState(t, rt, restored, sandbox.StateRunning, s.opts.StartTimeout)
	if sb.SnapshotID != string(snapID) {
		t.Fatalf("restored sandbox SnapshotID %q, want %s", sb.SnapshotID, snapID)
	}
	rt.Delete(ctx, restored)
	list, err := sn.ListSnapshots(ctx)
	if err != nil || len(list) == 0 {
		t.Fatalf("ListSnapshots: %d, %v", len(list), err)
	}
	if err := sn.DeleteSnapshot(ctx, snapID); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	if _, err := sn.GetSnapshot(ctx, snapID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("GetSnapshot after delete: %v", err)
	}
}

func (s *suite) concurrentCreates(t *testing.T) {
	rt := s.new(t)
	const n = 8
	ids := make([]sandbox.ID, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = sandbox.NewID()
			if _, err := rt.Create(context.Background(), ids[i], s.spec()); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Create: %v", err)
	}
	for _, id := range ids {
		WaitState(t, rt, id, sandbox.StateRunning, s.opts.StartTimeout)
		rt.Delete(context.Background(), id)
	}
}

// ReachExecd proves an execd endpoint: /ping answers, and a command runs
// and prints what it was told.
func ReachExecd(t *testing.T, ep sandbox.Endpoint) {
	t.Helper()
	base := "http://" + ep.Address
	do := func(method, path, body string) (*http.Response, []byte) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range ep.Headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s%s: %v", method, base, path, err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp, data
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, body := do("GET", "/ping", "")
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("execd /ping: %d %s", resp.StatusCode, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	word := fmt.Sprintf("reached-%d", time.Now().UnixNano())
	resp, body := do("POST", "/command", `{"command":"echo `+word+`"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("execd /command: %d %s", resp.StatusCode, body)
	}
	dec := api.NewEventDecoder(strings.NewReader(string(body)))
	for {
		ev, err := dec.Next()
		if err != nil {
			t.Fatalf("execd /command output has no %q: %s", word, body)
		}
		if ev.Type == api.EventStdout && ev.Text == word {
			return
		}
	}
}
