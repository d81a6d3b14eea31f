package lcclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// The wire types of /v1/pools (protocol/lifecycle.md); they live here
// until package api has them.
type (
	// PoolCapacity is a pool's capacitySpec.
	PoolCapacity struct {
		BufferMax int `json:"bufferMax"`
		BufferMin int `json:"bufferMin"`
		PoolMax   int `json:"poolMax"`
		PoolMin   int `json:"poolMin"`
	}
	// PoolRequest is the body of a pool's create.
	PoolRequest struct {
		Name         string                   `json:"name"`
		Template     api.CreateSandboxRequest `json:"template"`
		CapacitySpec PoolCapacity             `json:"capacitySpec"`
	}
	// PoolStatus is how many sandboxes a pool holds.
	PoolStatus struct {
		Total     int `json:"total"`
		Allocated int `json:"allocated"`
		Available int `json:"available"`
	}
	// PoolResponse is a pool as the server describes it.
	PoolResponse struct {
		Name   string      `json:"name"`
		Status *PoolStatus `json:"status,omitempty"`
	}
)

// CreatePool creates the pool name of sandboxes like template with
// capacity c, without waiting for them. It returns ErrNoPools if the
// server has no pools.
func (c *Client) CreatePool(ctx context.Context, name string, template api.CreateSandboxRequest, capacity PoolCapacity) error {
	code, data, err := c.Do(ctx, "POST", "/v1/pools", PoolRequest{Name: name, Template: template, CapacitySpec: capacity})
	switch {
	case err != nil:
		return fmt.Errorf("create pool: %w", err)
	case code == http.StatusNotImplemented:
		return ErrNoPools
	case code != http.StatusCreated:
		return fmt.Errorf("create pool: %d %s", code, bytes.TrimSpace(data))
	}
	return nil
}

// WaitPool polls the pool name every interval until at least n of its
// sandboxes are available, for at most timeout.
func (c *Client) WaitPool(ctx context.Context, name string, n int, timeout, interval time.Duration) error {
	var last PoolStatus
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		code, data, err := c.Do(ctx, "GET", "/v1/pools/"+name, nil)
		if err != nil {
			return fmt.Errorf("get pool: %w", err)
		}
		if code != http.StatusOK {
			return fmt.Errorf("get pool: %d %s", code, bytes.TrimSpace(data))
		}
		var p PoolResponse
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("get pool: %w", err)
		}
		if p.Status != nil {
			last = *p.Status
			if last.Available >= n {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
	return fmt.Errorf("pool %s: %d of %d available after %v (total %d, allocated %d): %w", name, last.Available, n, timeout, last.Total, last.Allocated, ErrTimeout)
}

// DeletePool deletes the pool name and its waiting sandboxes; a pool that
// does not exist, or a server without pools, is not an error.
func (c *Client) DeletePool(ctx context.Context, name string) error {
	code, data, err := c.Do(ctx, "DELETE", "/v1/pools/"+name, nil)
	if err != nil {
		return fmt.Errorf("delete pool: %w", err)
	}
	if code != http.StatusNoContent && code != http.StatusNotFound && code != http.StatusNotImplemented {
		return fmt.Errorf("delete pool: %d %s", code, bytes.TrimSpace(data))
	}
	return nil
}
