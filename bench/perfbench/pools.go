package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// poolName is the pool every pooled row uses, one at a time.
const poolName = "bench"

// errNoPools is returned when the server answers 501 on /pools: it has no
// warm pools (yet), and the pooled rows say so instead of failing.
var errNoPools = errors.New("not available (pools answered 501)")

// The wire types of /v1/pools (protocol/lifecycle.md); they live here
// until package api has them.
type (
	poolCapacity struct {
		BufferMax int `json:"bufferMax"`
		BufferMin int `json:"bufferMin"`
		PoolMax   int `json:"poolMax"`
		PoolMin   int `json:"poolMin"`
	}
	poolRequest struct {
		Name         string                   `json:"name"`
		Template     api.CreateSandboxRequest `json:"template"`
		CapacitySpec poolCapacity             `json:"capacitySpec"`
	}
	poolStatus struct {
		Total     int `json:"total"`
		Allocated int `json:"allocated"`
		Available int `json:"available"`
	}
	poolResponse struct {
		Name   string      `json:"name"`
		Status *poolStatus `json:"status,omitempty"`
	}
)

// createPool creates the pool and waits until buffer sandboxes are
// available in it. It returns errNoPools if the server has no pools.
func (s *server) createPool(ctx context.Context, template api.CreateSandboxRequest, buffer, poolMax int) error {
	s.deletePool(ctx) // one left by an earlier step that failed
	req := poolRequest{Name: poolName, Template: template,
		CapacitySpec: poolCapacity{BufferMin: buffer, BufferMax: buffer, PoolMin: buffer, PoolMax: poolMax}}
	code, data, err := s.do(ctx, "POST", "/v1/pools", req)
	switch {
	case err != nil:
		return fmt.Errorf("create pool: %w", err)
	case code == http.StatusNotImplemented:
		return errNoPools
	case code != http.StatusCreated:
		return fmt.Errorf("create pool: %d %s", code, bytes.TrimSpace(data))
	}
	return s.waitPool(ctx, buffer, 30*time.Second+time.Duration(buffer)*time.Second)
}

// waitPool polls the pool until at least n of its sandboxes are
// available, for at most timeout.
func (s *server) waitPool(ctx context.Context, n int, timeout time.Duration) error {
	var last poolStatus
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		code, data, err := s.do(ctx, "GET", "/v1/pools/"+poolName, nil)
		if err != nil {
			return fmt.Errorf("get pool: %w", err)
		}
		if code != http.StatusOK {
			return fmt.Errorf("get pool: %d %s", code, bytes.TrimSpace(data))
		}
		var p poolResponse
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
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("pool %s: %d of %d available after %v (total %d, allocated %d)", poolName, last.Available, n, timeout, last.Total, last.Allocated)
}

// deletePool deletes the pool; one that does not exist is not an error.
func (s *server) deletePool(ctx context.Context) error {
	code, data, err := s.do(ctx, "DELETE", "/v1/pools/"+poolName, nil)
	if err != nil {
		return fmt.Errorf("delete pool: %w", err)
	}
	if code != http.StatusNoContent && code != http.StatusNotFound && code != http.StatusNotImplemented {
		return fmt.Errorf("delete pool: %d %s", code, bytes.TrimSpace(data))
	}
	return nil
}
