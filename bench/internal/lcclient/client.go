// Package lcclient is the benchmark harnesses' client for a lifecycle
// server (opensandbox-server) and for the execd of its sandboxes: it
// speaks HTTP as the SDK does, so that what a harness times is what a
// client waits for. It also builds and runs a server process on a
// throwaway configuration.
package lcclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// ExecdPort is execd's port in every sandbox, as paths spell it.
var ExecdPort = strconv.Itoa(api.ExecdPort)

// ErrTimeout is wrapped by the errors of a wait that ran out of time.
var ErrTimeout = errors.New("timed out")

// ErrNoPools is returned when the server answers 501 on /pools: it has no
// warm pools.
var ErrNoPools = errors.New("not available (pools answered 501)")

// RandomHex is n random bytes in hexadecimal.
func RandomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Client is a client of one lifecycle server: requests go to Base
// (http://HOST:PORT) with the API key Key, through HC, which also
// carries the requests to execd.
type Client struct {
	Base string
	Key  string
	HC   *http.Client
}

// Do sends a request to the server, with body as JSON unless it is nil,
// and returns the status and body of the answer.
func (c *Client) Do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set(api.HeaderAPIKey, c.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.HC.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// TimeoutSeconds is the timeout of every sandbox the harnesses create:
// long enough for the longest run, short enough that a leak expires.
const TimeoutSeconds int64 = 1800

// CreateRequest is a create of a sandbox of image that runs entrypoint
// within limits, with the timeout TimeoutSeconds.
func CreateRequest(image string, entrypoint []string, limits map[string]string) api.CreateSandboxRequest {
	timeout := TimeoutSeconds
	return api.CreateSandboxRequest{Image: &api.ImageSpec{URI: image}, Entrypoint: entrypoint,
		ResourceLimits: limits, Timeout: &timeout}
}

// PooledRequest is a create from the pool named pool, with the timeout
// TimeoutSeconds: image and limits come from its template, and so does
// the entrypoint when entrypoint is nil.
func PooledRequest(pool string, entrypoint []string) api.CreateSandboxRequest {
	timeout := TimeoutSeconds
	return api.CreateSandboxRequest{Entrypoint: entrypoint, Timeout: &timeout,
		Extensions: map[string]string{"poolRef": pool}}
}

// Create posts req and returns the new sandbox's ID and state.
func (c *Client) Create(ctx context.Context, req api.CreateSandboxRequest) (id, state string, err error) {
	code, data, err := c.Do(ctx, "POST", "/v1/sandboxes", req)
	if err != nil {
		return "", "", fmt.Errorf("create sandbox: %w", err)
	}
	if code != http.StatusAccepted {
		return "", "", fmt.Errorf("create sandbox: %d %s", code, bytes.TrimSpace(data))
	}
	var resp api.CreateSandboxResponse
	if err := json.Unmarshal(data, &resp); err != nil {
		return "", "", fmt.Errorf("create sandbox: %w", err)
	}
	return resp.ID, resp.Status.State, nil
}

// WaitRunning polls the sandbox until it is Running, for at most two
// minutes: first every millisecond, then half as often again each time
// up to maxDelay, so that a fast start is seen at once and many slow
// ones do not flood the server. A sandbox that is Failed or Terminated
// is an error at once.
func (c *Client) WaitRunning(ctx context.Context, id string, maxDelay time.Duration) error {
	delay := time.Millisecond
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		code, data, err := c.Do(ctx, "GET", "/v1/sandboxes/"+id, nil)
		if err != nil {
			return fmt.Errorf("get sandbox %s: %w", id, err)
		}
		if code != http.StatusOK {
			return fmt.Errorf("get sandbox %s: %d %s", id, code, bytes.TrimSpace(data))
		}
		var sb api.Sandbox
		if err := json.Unmarshal(data, &sb); err != nil {
			return fmt.Errorf("get sandbox %s: %w", id, err)
		}
		switch sb.Status.State {
		case "Running":
			return nil
		case "Failed", "Terminated":
			return fmt.Errorf("sandbox %s is %s: %s %s", id, sb.Status.State, sb.Status.Reason, sb.Status.Message)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*3/2+time.Millisecond/2, maxDelay)
	}
	return fmt.Errorf("sandbox %s was not Running within 2 minutes: %w", id, ErrTimeout)
}

// CreateToCommand creates a sandbox with req, waits until it is Running
// (see WaitRunning for maxPoll) and runs `true` in it through execd:
// what a client waits for before its first command has run. It returns
// the sandbox's ID even on failure, when there is one, so that the
// caller can delete it.
func (c *Client) CreateToCommand(ctx context.Context, req api.CreateSandboxRequest, maxPoll time.Duration) (string, error) {
	id, state, err := c.Create(ctx, req)
	if err != nil {
		return "", err
	}
	if state != "Running" {
		if err := c.WaitRunning(ctx, id, maxPoll); err != nil {
			return id, err
		}
	}
	_, err = c.Run(ctx, id, "true")
	return id, err
}

// Delete deletes a sandbox; a sandbox already gone is not an error.
func (c *Client) Delete(ctx context.Context, id string) error {
	code, data, err := c.Do(ctx, "DELETE", "/v1/sandboxes/"+id, nil)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if code != http.StatusNoContent && code != http.StatusNotFound {
		return fmt.Errorf("delete sandbox %s: %d %s", id, code, bytes.TrimSpace(data))
	}
	return nil
}
