package lifecycle

import (
	"maps"
	"slices"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// toAPISandbox returns sb as the wire shows it: image (its uri only, never
// credentials) only when it was made from an image, entrypoint always
// present, expiresAt only when it expires, every time in UTC.
func toAPISandbox(sb *sandbox.Sandbox) api.Sandbox {
	out := api.Sandbox{
		ID:         string(sb.ID),
		SnapshotID: sb.SnapshotID,
		Platform:   toAPIPlatform(sb.Platform),
		Status:     toAPIStatus(sb.Status),
		Metadata:   maps.Clone(sb.Metadata),
		Entrypoint: entrypointOf(sb),
		ExpiresAt:  utcPtr(sb.ExpiresAt),
		CreatedAt:  sb.CreatedAt.UTC(),
	}
	if sb.SnapshotID == "" && sb.Image != "" {
		out.Image = &api.ImageSpec{URI: sb.Image}
	}
	return out
}

// toCreateResponse returns sb as POST /sandboxes answers it: a Sandbox
// without image and snapshotId.
func toCreateResponse(sb *sandbox.Sandbox) api.CreateSandboxResponse {
	return api.CreateSandboxResponse{
		ID:         string(sb.ID),
		Status:     toAPIStatus(sb.Status),
		Metadata:   maps.Clone(sb.Metadata),
		Platform:   toAPIPlatform(sb.Platform),
		ExpiresAt:  utcPtr(sb.ExpiresAt),
		CreatedAt:  sb.CreatedAt.UTC(),
		Entrypoint: entrypointOf(sb),
	}
}

// entrypointOf returns the sandbox's entrypoint, [] rather than null.
func entrypointOf(sb *sandbox.Sandbox) []string {
	if sb.Entrypoint == nil {
		return []string{}
	}
	return slices.Clone(sb.Entrypoint)
}

// toAPIStatus returns a status as the wire shows it.
func toAPIStatus(st sandbox.Status) api.SandboxStatus {
	return api.SandboxStatus{
		State:            string(st.State),
		Reason:           st.Reason,
		Message:          st.Message,
		LastTransitionAt: utcPtrOf(st.Since),
	}
}

// toAPIPlatform returns a platform as the wire shows it; nil stays nil.
func toAPIPlatform(p *sandbox.Platform) *api.PlatformSpec {
	if p == nil {
		return nil
	}
	return &api.PlatformSpec{OS: p.OS, Arch: p.Arch}
}

// toAPISnapshot returns a snapshot as the wire shows it.
func toAPISnapshot(sn *sandbox.Snapshot) api.Snapshot {
	return api.Snapshot{
		ID:        string(sn.ID),
		SandboxID: string(sn.SandboxID),
		Name:      sn.Name,
		Status: api.SnapshotStatus{
			State:            string(sn.State),
			Reason:           sn.Reason,
			Message:          sn.Message,
			LastTransitionAt: utcPtrOf(sn.Since),
		},
		CreatedAt: sn.CreatedAt.UTC(),
	}
}

// utcPtr returns a copy of *t in UTC, or nil.
func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// utcPtrOf returns t in UTC, or nil for the zero time.
func utcPtrOf(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
