package sdk

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// CreateSnapshot starts capturing a sandbox's file system as a snapshot
// and returns it in state Creating; WaitSnapshot waits for Ready. A new
// sandbox is made from it with CreateOptions.SnapshotID.
func (c *Client) CreateSnapshot(ctx context.Context, sandboxID, name string) (*api.Snapshot, error) {
	var body api.CreateSnapshotRequest
	if name != "" {
		body.Name = &name
	}
	r, err := c.server.jsonReq("snapshot sandbox "+sandboxID, http.MethodPost, "/sandboxes/"+url.PathEscape(sandboxID)+"/snapshots", nil, body)
	if err != nil {
		return nil, err
	}
	var out api.Snapshot
	if err := c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetSnapshot returns a snapshot by id.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*api.Snapshot, error) {
	r := c.server.req("get snapshot "+id, http.MethodGet, "/snapshots/"+url.PathEscape(id), nil)
	r.idempotent = true
	var out api.Snapshot
	if err := c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SnapshotListOptions filters and pages a list of snapshots.
type SnapshotListOptions struct {
	SandboxID      string
	States         []string
	Page, PageSize int
}

// ListSnapshots returns one page of snapshots.
func (c *Client) ListSnapshots(ctx context.Context, opts SnapshotListOptions) (*api.ListSnapshotsResponse, error) {
	q := url.Values{}
	if opts.SandboxID != "" {
		q.Set("sandboxId", opts.SandboxID)
	}
	for _, s := range opts.States {
		q.Add("state", s)
	}
	if opts.Page > 0 {
		q.Set("page", strconv.Itoa(opts.Page))
	}
	if opts.PageSize > 0 {
		q.Set("pageSize", strconv.Itoa(opts.PageSize))
	}
	r := c.server.req("list snapshots", http.MethodGet, "/snapshots", q)
	r.idempotent = true
	var out api.ListSnapshotsResponse
	if err := c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSnapshot deletes a snapshot; sandboxes made from it live on.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	r := c.server.req("delete snapshot "+id, http.MethodDelete, "/snapshots/"+url.PathEscape(id), nil)
	r.idempotent = true
	return c.t.call(ctx, r, nil)
}

// WaitSnapshot waits until a snapshot is Ready and returns it; a snapshot
// that fails is an error with the server's reason.
func (c *Client) WaitSnapshot(ctx context.Context, id string) (*api.Snapshot, error) {
	for delay := 50 * time.Millisecond; ; delay = min(delay*2, time.Second) {
		snap, err := c.GetSnapshot(ctx, id)
		if err != nil {
			return nil, err
		}
		switch snap.Status.State {
		case SnapshotReady:
			return snap, nil
		case SnapshotFailed:
			return nil, fmt.Errorf("snapshot %s failed: %s %s", id, snap.Status.Reason, snap.Status.Message)
		}
		if err := sleep(ctx, delay); err != nil {
			return nil, fmt.Errorf("wait for snapshot %s (now %s): %w", id, snap.Status.State, err)
		}
	}
}
