package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/warmpool"
	"github.com/opensandbox/opensandbox/sandbox"
)

// A measured sandbox's entrypoint is held. The disk watcher learns of a
// container only once the engine has started it and answered an inspect;
// an entrypoint that writes from its first instant would meanwhile write
// into its page cache at memory speed, unmeasured, hundreds of MiB past a
// small limit. So a sandbox whose limit the watcher enforces (watch mode)
// starts with execd alone (--claimable, as warm pool sandboxes do, and
// labelHeld), and the server hands the entrypoint over through execd's
// /claim, with the sandbox's own token, once the watcher has measured the
// container: from the entrypoint's first write on, the sandbox is held to
// its limit as one that starts writing later is.
//
// Each start of the container gets the entrypoint once. execd takes one
// claim in its life and refuses any other (409), so a hand-over repeated
// after a restart of the server never starts it twice; the record keeps
// which start was handed over (HeldStart, the engine's StartedAt), so that
// a server finds the containers that started again while none ran, and
// hands each its entrypoint.

// heldEntrypoint reports whether a sandbox limited to limit bytes of disk
// (0: none) with entrypoint argv starts with its entrypoint held.
func heldEntrypoint(cfg *Config, limit int64, argv []string) bool {
	return limit > 0 && len(argv) > 0 && cfg.storage.mode() == storageWatch
}

// isHeld reports whether a container was made with its entrypoint held.
func isHeld(labels map[string]string) bool { return labels[labelHeld] == "true" }

// heldClient calls execd's /claim of a held sandbox; it never goes
// through a proxy.
var heldClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
}

// handOverEntrypoint starts the held entrypoint of sandbox id, whose
// container (info) runs and whose execd answers at execdAddr with token,
// once the disk watcher has measured the container. A hand-over execd
// already took (by a server that stopped before it recorded it) counts as
// done.
func (r *Runtime) handOverEntrypoint(ctx context.Context, id sandbox.ID, info containerInfo, execdAddr, token string) error {
	start := time.Now()
	if r.disk != nil {
		wctx, cancel := context.WithTimeout(ctx, r.cfg.StartTimeout)
		err := r.disk.waitMeasured(wctx, id, info.Files.Pid)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if c, ierr := r.eng.inspect(ctx, info.ID); ierr == nil && c.StartedAt != info.StartedAt {
				return &failure{"CONTAINER_EXITED_ERROR", fmt.Sprintf("the container stopped (%s, exit code %d) before its entrypoint was started", c.State, c.ExitCode)}
			}
			return &failure{"DISK_NOT_MEASURED", fmt.Sprintf("the server could not measure the sandbox's disk within %v, and did not start its entrypoint, which waits for that: %v", r.cfg.StartTimeout, err)}
		}
	} else {
		// This server does not measure disks (its engine's files are out
		// of its sight now): nothing would ever release the entrypoint.
		r.log.Warn("a sandbox's entrypoint waits for its disk to be measured, which this server cannot do; starting it unmeasured", "sandbox", id)
	}
	measured := time.Since(start)
	var argv []string
	if err := json.Unmarshal([]byte(info.Labels[labelEntrypoint]), &argv); err != nil || len(argv) == 0 {
		return &failure{"INVALID_CONFIGURATION", fmt.Sprintf("the container's entrypoint label %q is not an entrypoint", info.Labels[labelEntrypoint])}
	}
	err := warmpool.ClaimExecd(ctx, heldClient, execdURL(execdAddr), token, api.ClaimRequest{Token: token, Entrypoint: argv})
	switch {
	case errors.Is(err, warmpool.ErrClaimed):
		r.log.Info("the held entrypoint had been handed over already", "sandbox", id)
	case err != nil:
		return &failure{"ENTRYPOINT_NOT_STARTED", fmt.Sprintf("hand the entrypoint to execd: %v", err)}
	}
	r.log.Debug("entrypoint handed over", "sandbox", id, "held", time.Since(start), "measured", measured)
	return nil
}

// needsHandOver inspects the running container of a held sandbox and
// reports whether it started since its entrypoint was last handed over
// (heldStart).
func (r *Runtime) needsHandOver(ctx context.Context, cid, heldStart string) (bool, error) {
	info, err := r.eng.inspect(ctx, cid)
	if err != nil {
		return false, err
	}
	if info.State != "running" {
		return false, nil
	}
	if info.StartedAt == "" {
		return false, errors.New("the engine gives no start time")
	}
	return info.StartedAt != heldStart, nil
}
