package benchkit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// ErrTimeout is wrapped by the errors of a wait that ran out of time.
var ErrTimeout = errors.New("timed out")

// SandboxTimeout is the lifetime of every sandbox the harnesses create:
// long enough for the longest run, short enough that a leak expires.
const SandboxTimeout = 30 * time.Minute

// NewClient is an SDK client of the server at addr (HOST:PORT) with key,
// as the harnesses use it: up to maxConns connections kept per host (the
// server and each sandbox), no retries (a failure is part of what is
// measured, not hidden by a second try), and requests bounded only so
// that a wedged engine cannot hang the run.
func NewClient(addr, key string, maxConns int) (*sdk.Client, error) {
	return sdk.NewClient(sdk.Config{
		Domain: addr, APIKey: key, Retries: -1, RequestTimeout: 5 * time.Minute,
		HTTPClient: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConns: 4 * maxConns, MaxIdleConnsPerHost: maxConns}},
		UserAgent:  "opensandbox-bench",
	})
}

// Sandbox is what the harnesses create: image running entrypoint within
// limits, for SandboxTimeout. The create returns at once (see
// CreateToCommand for the wait).
func Sandbox(image string, entrypoint []string, limits map[string]string) sdk.CreateOptions {
	return sdk.CreateOptions{Image: image, Entrypoint: entrypoint, Resources: limits, Timeout: SandboxTimeout, SkipHealthCheck: true}
}

// Pooled is a create from the pool named pool, for SandboxTimeout: image
// and limits come from its template, and so does the entrypoint when
// entrypoint is nil.
func Pooled(pool string, entrypoint []string) sdk.CreateOptions {
	return sdk.CreateOptions{Pool: pool, Entrypoint: entrypoint, Timeout: SandboxTimeout, SkipHealthCheck: true}
}

// WaitRunning polls the sandbox until it is Running, for at most two
// minutes: first every millisecond, then half as often again each time
// up to maxDelay, so that a fast start is seen at once and many slow
// ones do not flood the server. (The SDK's own wait, for its users,
// polls from 10 ms doubling to 250 ms, which would add up to that much to
// what the harnesses time.) A sandbox that is Failed or Terminated is an
// error at once.
func WaitRunning(ctx context.Context, c *sdk.Client, id string, maxDelay time.Duration) error {
	delay := time.Millisecond
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		sb, err := c.Get(ctx, id)
		if err != nil {
			return err
		}
		switch sb.Status.State {
		case sdk.StateRunning:
			return nil
		case sdk.StateFailed, sdk.StateTerminated:
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

// CreateToCommand creates a sandbox with opts (SkipHealthCheck, as
// Sandbox and Pooled give), waits until it is Running (see WaitRunning
// for maxPoll) and runs `true` in it through execd: what a client waits
// for before its first command has run. It returns the sandbox even on
// failure, when there is one, so that the caller can delete it.
func CreateToCommand(ctx context.Context, c *sdk.Client, opts sdk.CreateOptions, maxPoll time.Duration) (*sdk.Sandbox, error) {
	sb, err := c.Create(ctx, opts)
	if err != nil {
		return nil, err
	}
	if err := WaitRunning(ctx, c, sb.ID, maxPoll); err != nil {
		return sb, err
	}
	return sb, RunTrue(ctx, sb)
}

// RunTrue runs `true` in the sandbox and fails unless it exits 0.
func RunTrue(ctx context.Context, sb *sdk.Sandbox) error {
	res, err := sb.Run(ctx, "true", nil)
	if err == nil && !res.OK() {
		err = fmt.Errorf("`true` in sandbox %s: exit %d %v", sb.ID, res.ExitCode, describe(res.Error))
	}
	return err
}

func describe(e *api.ExecutionError) string {
	if e == nil {
		return ""
	}
	return e.EName + ": " + e.EValue
}

// Kill deletes a sandbox; one already gone is not an error.
func Kill(ctx context.Context, c *sdk.Client, id string) error {
	if err := c.Kill(ctx, id); err != nil && !errors.Is(err, sdk.ErrNotFound) {
		return err
	}
	return nil
}

// ErrNoPools is returned when the server has no warm pools (it answers
// 501 on /pools).
var ErrNoPools = errors.New("not available (pools answered 501)")

// CreatePool creates the pool name of sandboxes like tmpl with capacity,
// without waiting for them. It returns ErrNoPools if the server has no
// pools.
func CreatePool(ctx context.Context, c *sdk.Client, name string, tmpl sdk.PoolTemplate, capacity sdk.Capacity) error {
	_, err := c.Pools().Create(ctx, name, tmpl, capacity)
	if errors.Is(err, sdk.ErrNotSupported) {
		return ErrNoPools
	}
	return err
}

// WaitPool polls the pool name every interval until at least n of its
// sandboxes are available, for at most timeout.
func WaitPool(ctx context.Context, c *sdk.Client, name string, n int, timeout, interval time.Duration) error {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrTimeout)
	defer cancel()
	_, err := c.Pools().Wait(ctx, name, n, interval)
	if err != nil && context.Cause(ctx) == ErrTimeout {
		return fmt.Errorf("%w (%v): %w", err, timeout, ErrTimeout)
	}
	return err
}

// DeletePool deletes the pool name and its waiting sandboxes; a pool that
// does not exist, or a server without pools, is not an error.
func DeletePool(ctx context.Context, c *sdk.Client, name string) error {
	err := c.Pools().Delete(ctx, name)
	if errors.Is(err, sdk.ErrNotFound) || errors.Is(err, sdk.ErrNotSupported) {
		return nil
	}
	return err
}
