package lifecycle

import (
	"cmp"
	"net/http"
	"slices"
	"strings"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// createSnapshot answers POST /sandboxes/{id}/snapshots: 202 with the
// snapshot, Creating, and its address in Location. The body, {"name"},
// is optional.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.m.Snapshotter()
	if err != nil {
		return err
	}
	var req api.CreateSnapshotRequest
	if err := s.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	name := ""
	if req.Name != nil {
		if *req.Name == "" {
			return invalid(codeInvalidParameter, "name: must not be empty when given")
		}
		name = *req.Name
	}
	snap, err := sn.CreateSnapshot(r.Context(), sandbox.ID(r.PathValue("id")), sandbox.NewSnapshotID(), name)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/snapshots/"+string(snap.ID))
	return writeJSON(w, http.StatusAccepted, toAPISnapshot(snap))
}

// listSnapshots answers GET /snapshots: the snapshots of sandboxId (if
// given) in any of the states asked, newest first, one page of them.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.m.Snapshotter()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	states := parseStates(q["state"])
	sandboxID := q.Get("sandboxId")
	page, size, err := parsePage(q)
	if err != nil {
		return err
	}
	all, err := sn.ListSnapshots(r.Context())
	if err != nil {
		return err
	}
	var match []*sandbox.Snapshot
	for _, snap := range all {
		if (sandboxID == "" || string(snap.SandboxID) == sandboxID) && states.match(string(snap.State)) {
			match = append(match, snap)
		}
	}
	slices.SortFunc(match, func(a, b *sandbox.Snapshot) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(string(a.ID), string(b.ID)))
	})
	items, info := paginate(match, page, size)
	out := api.ListSnapshotsResponse{Items: make([]api.Snapshot, 0, len(items)), Pagination: info}
	for _, snap := range items {
		out.Items = append(out.Items, toAPISnapshot(snap))
	}
	return writeJSON(w, http.StatusOK, out)
}

// getSnapshot answers GET /snapshots/{id}.
func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.m.Snapshotter()
	if err != nil {
		return err
	}
	id := sandbox.SnapshotID(r.PathValue("id"))
	snap, err := sn.GetSnapshot(r.Context(), id)
	if err != nil {
		return snapshotNotFound(err, id)
	}
	return writeJSON(w, http.StatusOK, toAPISnapshot(snap))
}

// deleteSnapshot answers DELETE /snapshots/{id}: 204; a snapshot still
// Creating is a 409.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.m.Snapshotter()
	if err != nil {
		return err
	}
	id := sandbox.SnapshotID(r.PathValue("id"))
	if err := sn.DeleteSnapshot(r.Context(), id); err != nil {
		return snapshotNotFound(err, id)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
