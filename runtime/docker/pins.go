package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/sandbox"
)

// pinsDir holds every sandbox's pins (see pin_linux.go), one directory per
// sandbox, inside the runtime's data directory, which only the server's
// user can reach and which no allow-list entry may contain or lie in.
func (c *Config) pinsDir() string { return filepath.Join(c.DataDir, "mounts") }

// enginePidFile is where a local engine writes its pid (dockerd's
// default --pidfile).
const enginePidFile = "/var/run/docker.pid"

// pinTarget is the staging path of the i-th volume of sandbox id: the
// source the engine mounts. It is fixed by id, i and the volume's name,
// so that a container made before a restart finds its pins again.
func (c *Config) pinTarget(id sandbox.ID, i int, v *sandbox.Volume) string {
	return filepath.Join(c.pinsDir(), string(id), strconv.Itoa(i)+"-"+v.Name)
}

// pinned reports whether volume v reaches the engine through a pin: every
// host volume, and a named volume mounted at a sub path.
func pinned(v *sandbox.Volume) bool {
	return v.HostPath != "" || (v.Claim != nil && v.SubPath != "")
}

// needsPins reports whether a sandbox of these volumes needs pins.
func needsPins(vols []sandbox.Volume) bool {
	for i := range vols {
		if pinned(&vols[i]) {
			return true
		}
	}
	return false
}

// pinVolumes (re)makes the pins of a sandbox's volumes, right before its
// container is made or started. A host path has been checked with its
// links resolved, so any link in it now was swapped in since; a named
// volume's sub path is the sandboxes' to shape, so no link is followed in
// it either. Either fails the sandbox, as does a path that has gone.
func (r *Runtime) pinVolumes(ctx context.Context, id sandbox.ID, vols []sandbox.Volume) error {
	for i := range vols {
		v := &vols[i]
		if !pinned(v) {
			continue
		}
		var root, rel string
		switch {
		case v.HostPath != "":
			// The lifecycle server checked the path with every link
			// resolved: opened from / with no link allowed anywhere, it
			// leads exactly where the check said, or nowhere.
			root, rel = "/", v.HostPath
		default:
			vi, err := r.eng.volumeInfo(ctx, v.Claim.Name)
			if err != nil {
				return &failure{"VOLUME_FAILED", fmt.Sprintf("volume %s: %v", v.Name, err)}
			}
			if err := subPathVolumeOK(vi); err != nil {
				return &failure{"VOLUME_FAILED", fmt.Sprintf("volume %s: %v", v.Name, err)}
			}
			root, rel = vi.Mountpoint, v.SubPath
			// As on Kubernetes, a sub path a volume lacks is made.
			if err := mkdirBeneath(root, rel); err != nil && !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
				return &failure{"VOLUME_FAILED", fmt.Sprintf("volume %s: %v", v.Name, err)}
			}
		}
		err := pin(root, rel, r.cfg.pinTarget(id, i, v))
		switch {
		case err == nil:
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
			return &failure{"VOLUME_CHANGED", fmt.Sprintf("volume %s: %s has a symbolic link on the way now; it changed since it was checked, and is not mounted", v.Name, filepath.Join(root, rel))}
		case errors.Is(err, os.ErrNotExist):
			return &failure{"VOLUME_NOT_FOUND", fmt.Sprintf("volume %s: %s does not exist", v.Name, filepath.Join(root, rel))}
		default:
			return &failure{"VOLUME_FAILED", fmt.Sprintf("volume %s: %v", v.Name, err)}
		}
	}
	return nil
}

// subPathVolumeOK says whether a named volume's sub paths can be pinned:
// its files must lie in a directory of this machine that exists without a
// container mounting it, which is what the local driver without options
// gives.
func subPathVolumeOK(vi volumeInfo) error {
	if vi.Driver != "local" || len(vi.Options) > 0 {
		return fmt.Errorf("named volume %s (driver %s) keeps its files elsewhere: subPath needs a plain local volume", vi.Name, vi.Driver)
	}
	if vi.Mountpoint == "" {
		return fmt.Errorf("named volume %s has no directory on this machine", vi.Name)
	}
	return nil
}

// releasePins unmounts the pins of a sandbox whose container has started
// (or failed to), keeping their empty staging paths: the engine wants a
// bind's source to exist whenever it starts the container, and the
// runtime pins them again before it starts the container itself.
func (r *Runtime) releasePins(id sandbox.ID) {
	dir := filepath.Join(r.cfg.pinsDir(), string(id))
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			r.log.Warn("list the volume pins of a sandbox", "sandbox", id, "err", err)
		}
		return
	}
	for _, ent := range entries {
		if err := unpin(filepath.Join(dir, ent.Name())); err != nil {
			r.log.Warn("release a volume pin", "sandbox", id, "err", err)
		}
	}
}

// subPathUser returns a sandbox other than id that mounts a sub path of
// the named volume, or "" when none does.
func (r *Runtime) subPathUser(id sandbox.ID, volume string) sandbox.ID {
	recs, err := r.st.records()
	if err != nil {
		r.log.Warn("read state", "err", err)
		return ""
	}
	for other, rec := range recs {
		if other != id && !rec.Deleting && slices.Contains(rec.SubPathVolumes, volume) {
			return other
		}
	}
	return ""
}

// removeSandboxPins removes the pins of a sandbox whose container is gone.
func (r *Runtime) removeSandboxPins(id sandbox.ID) {
	if err := removePins(filepath.Join(r.cfg.pinsDir(), string(id))); err != nil {
		r.log.Warn("remove the volume pins of a sandbox", "sandbox", id, "err", err)
	}
}

// sweepPins removes the pins of sandboxes the runtime no longer has: left
// by a delete that could not unmount them, or by a crash.
func (r *Runtime) sweepPins() {
	entries, err := os.ReadDir(r.cfg.pinsDir())
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			r.log.Warn("list volume pins", "err", err)
		}
		return
	}
	for _, ent := range entries {
		id := sandbox.ID(ent.Name())
		r.mu.Lock()
		_, ok := r.byID[id]
		r.mu.Unlock()
		if !ok && ent.IsDir() {
			r.removeSandboxPins(id)
		}
	}
}
