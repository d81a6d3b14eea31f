package lifecycle

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/sandbox"
)

func TestSnapshots(t *testing.T) {
	e, rt := newEnv(t)
	// A sandbox that stays Pending (the fake's delay is read at create).
	rt.StartDelay = time.Hour
	pending := e.create("")
	rt.StartDelay = 10 * time.Millisecond
	e.call("POST", "/v1/sandboxes/"+pending+"/snapshots", "").wantError(t, 409, api.CodeSnapshotInvalidSourceState)
	a, b := e.create(""), e.create("")
	e.waitState(a, sandbox.StateRunning)
	e.waitState(b, sandbox.StateRunning)

	// s1 stays Creating: the fake readies snapshots after StartDelay.
	rt.StartDelay = time.Hour
	r := e.call("POST", "/v1/sandboxes/"+a+"/snapshots", `{"name":"first"}`).wantStatus(t, 202)
	rt.StartDelay = time.Millisecond
	var s1 api.Snapshot
	r.decode(t, &s1)
	if s1.SandboxID != a || s1.Name != "first" || s1.Status.State != "Creating" || s1.Status.Reason != "snapshot_accepted" || s1.ID == "" {
		t.Fatalf("snapshot %s", r.body)
	}
	if loc := r.header.Get("Location"); loc != "/v1/snapshots/"+s1.ID {
		t.Fatalf("Location %q", loc)
	}
	e.call("DELETE", "/v1/snapshots/"+s1.ID, "").wantError(t, 409, api.CodeSnapshotInvalidState)

	time.Sleep(2 * time.Millisecond) // distinct creation times
	var s2, s3 api.Snapshot
	e.call("POST", "/sandboxes/"+a+"/snapshots", `  `).wantStatus(t, 202).decode(t, &s2)
	time.Sleep(2 * time.Millisecond)
	e.call("POST", "/v1/sandboxes/"+b+"/snapshots", `{}`).wantStatus(t, 202).decode(t, &s3)
	waitSnapshot(t, e, s2.ID, "Ready")
	waitSnapshot(t, e, s3.ID, "Ready")

	list := func(q string) []string {
		t.Helper()
		var out api.ListSnapshotsResponse
		e.call("GET", "/v1/snapshots"+q, "").wantStatus(t, 200).decode(t, &out)
		var ids []string
		for _, s := range out.Items {
			ids = append(ids, s.ID)
		}
		return ids
	}
	tests := []struct {
		q    string
		want []string
	}{
		{"", []string{s3.ID, s2.ID, s1.ID}},
		{"?sandboxId=" + a, []string{s2.ID, s1.ID}},
		{"?sandboxId=" + b + "&state=ready", []string{s3.ID}},
		{"?state=Creating", []string{s1.ID}},
		{"?state=creating&state=READY&pageSize=1&page=2", []string{s2.ID}},
		{"?state=Failed", nil},
		{"?sandboxId=nope", nil},
	}
	for _, tt := range tests {
		if got := list(tt.q); strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("GET /snapshots%s = %v, want %v", tt.q, got, tt.want)
		}
	}
	e.call("GET", "/v1/snapshots?pageSize=201", "").wantError(t, 400, api.CodeSandboxInvalidParameter)

	var got api.Snapshot
	e.call("GET", "/v1/snapshots/"+s2.ID, "").wantStatus(t, 200).decode(t, &got)
	if got.Status.State != "Ready" || got.Status.Reason != "snapshot_ready" || got.Status.LastTransitionAt == nil || got.SandboxID != a {
		t.Fatalf("GET snapshot %+v", got)
	}
	// Snapshots outlive their sandbox.
	e.call("DELETE", "/v1/sandboxes/"+a, "").wantStatus(t, 204)
	e.call("GET", "/v1/snapshots/"+s2.ID, "").wantStatus(t, 200)
	e.call("DELETE", "/v1/snapshots/"+s2.ID, "").wantStatus(t, 204)
	e.call("GET", "/v1/snapshots/"+s2.ID, "").wantError(t, 404, api.CodeSnapshotNotFound)
	e.call("DELETE", "/v1/snapshots/"+s2.ID, "").wantError(t, 404, api.CodeSnapshotNotFound)

	e.call("POST", "/v1/sandboxes/nope/snapshots", "").wantError(t, 404, api.CodeDockerSandboxNotFound)
	e.call("POST", "/v1/sandboxes/"+b+"/snapshots", `{"name":""}`).wantError(t, 400, api.CodeSandboxInvalidParameter)
	e.call("POST", "/v1/sandboxes/"+b+"/snapshots", `{"name":`).wantError(t, 400, api.CodeSandboxInvalidParameter)
	if all, _ := rt.ListSnapshots(context.Background()); len(all) != 2 {
		t.Fatalf("runtime has %d snapshots, want 2", len(all))
	}
}

func TestSnapshotsNotImplemented(t *testing.T) {
	e := newEnvWith(t, bareRuntime{fake.New()})
	id := e.create("")
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/sandboxes/" + id + "/snapshots"},
		{"GET", "/v1/snapshots"},
		{"GET", "/v1/snapshots/x"},
		{"DELETE", "/v1/snapshots/x"},
	} {
		e.call(c.method, c.path, "").wantError(t, 501, api.CodeSnapshotNotImplemented)
	}
	e.call("POST", "/v1/sandboxes", `{"snapshotId":"x","resourceLimits":{}}`).wantError(t, 501, api.CodeSnapshotNotImplemented)
}
