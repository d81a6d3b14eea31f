package main

import (
	"context"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/sdk"
)

// poolName is the pool every pooled row uses, one at a time.
const poolName = "bench"

// errNoPools is returned when the server answers 501 on /pools: it has no
// warm pools (yet), and the pooled rows say so instead of failing.
var errNoPools = benchkit.ErrNoPools

// createPool creates the pool and waits until buffer sandboxes are
// available in it. It returns errNoPools if the server has no pools.
func (s *server) createPool(ctx context.Context, template sdk.PoolTemplate, buffer, poolMax int) error {
	s.deletePool(ctx) // one left by an earlier step that failed
	c := sdk.Capacity{BufferMin: buffer, BufferMax: buffer, PoolMin: buffer, PoolMax: poolMax}
	if err := benchkit.CreatePool(ctx, s.c, poolName, template, c); err != nil {
		return err
	}
	return s.waitPool(ctx, buffer, 30*time.Second+time.Duration(buffer)*time.Second)
}

// waitPool polls the pool every 20 ms until at least n of its sandboxes
// are available, for at most timeout.
func (s *server) waitPool(ctx context.Context, n int, timeout time.Duration) error {
	return benchkit.WaitPool(ctx, s.c, poolName, n, timeout, 20*time.Millisecond)
}

// deletePool deletes the pool; one that does not exist is not an error.
func (s *server) deletePool(ctx context.Context) error {
	return benchkit.DeletePool(ctx, s.c, poolName)
}
