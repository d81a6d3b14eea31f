package docker

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/opensandbox/opensandbox/sandbox"
)

// store keeps, in one embedded database file, what the engine does not:
// each sandbox's mutable facts (expiry, metadata), a create in progress,
// a failure that left no container, the sandboxes' event logs, and the
// snapshots. Immutable facts also travel in container labels, so the
// engine alone can rebuild most of it.
type store struct {
	db *bolt.DB
}

var (
	bucketSandboxes = []byte("sandboxes")
	bucketSnapshots = []byte("snapshots")
	bucketEvents    = []byte("events")
	// bucketDeleted holds tombstones: ids of deleted sandboxes, so that a
	// container that outlived its sandbox is removed, never adopted.
	bucketDeleted = []byte("deleted")
	// bucketPools holds the warm pools' definitions.
	bucketPools = []byte("pools")
)

// tombstoneTTL is how long a deleted sandbox's id is remembered.
const tombstoneTTL = 24 * time.Hour

// maxEvents bounds the events kept per sandbox; the oldest go first.
const maxEvents = 200

// record is what the store keeps of a sandbox.
type record struct {
	ID           sandbox.ID        `json:"id"`
	Image        string            `json:"image,omitempty"`
	SnapshotID   string            `json:"snapshotId,omitempty"`
	Entrypoint   []string          `json:"entrypoint"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Extensions   map[string]string `json:"extensions,omitempty"`
	Platform     *sandbox.Platform `json:"platform,omitempty"`
	SecureAccess bool              `json:"secureAccess,omitempty"`
	CreatedAt    time.Time         `json:"createdAt"`
	ExpiresAt    *time.Time        `json:"expiresAt,omitempty"`
	// Spec is the create request (without registry credentials), kept
	// until the sandbox runs, so that a create interrupted by a restart
	// can be finished.
	Spec *sandbox.Spec `json:"spec,omitempty"`
	// NeededAuth records that the create pulled with credentials, which
	// are never stored: such a create cannot be resumed after a restart.
	NeededAuth bool `json:"neededAuth,omitempty"`
	// Failure is set when the sandbox failed; it may have no container.
	Failure *sandbox.Status `json:"failure,omitempty"`
	// OwnedVolumes are named volumes made for this sandbox that go with it.
	OwnedVolumes []string `json:"ownedVolumes,omitempty"`
	// SubPathVolumes are named volumes the sandbox mounts at a sub path:
	// the engine does not know it uses them, so the runtime keeps them
	// from being removed under it.
	SubPathVolumes []string `json:"subPathVolumes,omitempty"`
	// Deleting marks a delete in progress, which a restart finishes.
	Deleting bool `json:"deleting,omitempty"`
	// Token is the sandbox's execd token. The store file is readable by
	// the server's user only.
	Token string `json:"token,omitempty"`
	// Pool is the warm pool the sandbox was started for; PoolRevision the
	// pool's template revision then. Claimed is set when it was handed
	// out: until then it is the pool's, invisible to the API.
	Pool         string `json:"pool,omitempty"`
	PoolRevision int64  `json:"poolRevision,omitempty"`
	Claimed      bool   `json:"claimed,omitempty"`
	// Claiming marks a claim begun: execd may have taken it.
	Claiming bool `json:"claiming,omitempty"`
	// HeldStart is the start (the engine's StartedAt) of the sandbox's
	// container whose held entrypoint was handed over (held.go); a
	// container that started since waits for its own hand-over.
	HeldStart string `json:"heldStart,omitempty"`
	// EgressToken is the token of the sandbox's egress API; set when the
	// sandbox runs beside osb-egress (egress.go).
	EgressToken string `json:"egressToken,omitempty"`
}

// snapshotRecord is a snapshot and the image holding it.
type snapshotRecord struct {
	sandbox.Snapshot
	Image string `json:"image,omitempty"`
}

func openStore(path string) (*store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("open %s: another server holds it", path)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSandboxes, bucketSnapshots, bucketEvents, bucketDeleted, bucketPools} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("initialize %s: %w", path, err)
	}
	return &store{db: db}, nil
}

func (s *store) close() error { return s.db.Close() }

func put(tx *bolt.Tx, bucket []byte, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucket).Put([]byte(key), b)
}

func (s *store) putRecord(r *record) error {
	return s.db.Update(func(tx *bolt.Tx) error { return put(tx, bucketSandboxes, string(r.ID), r) })
}

// updateRecord applies fn to the stored record of id, if there is one.
func (s *store) updateRecord(id sandbox.ID, fn func(*record)) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSandboxes)
		raw := b.Get([]byte(id))
		if raw == nil {
			return nil
		}
		var r record
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("decode record %s: %w", id, err)
		}
		fn(&r)
		return put(tx, bucketSandboxes, string(id), &r)
	})
}

// bury removes a sandbox's record and events and leaves its tombstone.
func (s *store) bury(id sandbox.ID) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketSandboxes).Delete([]byte(id)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketEvents).Delete([]byte(id)); err != nil {
			return err
		}
		stamp, _ := time.Now().UTC().MarshalText()
		return tx.Bucket(bucketDeleted).Put([]byte(id), stamp)
	})
}

// deleted reports whether id has a tombstone.
func (s *store) deleted(id sandbox.ID) (bool, error) {
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		found = tx.Bucket(bucketDeleted).Get([]byte(id)) != nil
		return nil
	})
	return found, err
}

// tombstones returns the ids of deleted sandboxes, dropping those older
// than tombstoneTTL.
func (s *store) tombstones() (map[sandbox.ID]bool, error) {
	out := map[sandbox.ID]bool{}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketDeleted)
		var old [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var t time.Time
			if t.UnmarshalText(v) == nil && time.Since(t) > tombstoneTTL {
				old = append(old, append([]byte(nil), k...))
				return nil
			}
			out[sandbox.ID(k)] = true
			return nil
		})
		for _, k := range old {
			b.Delete(k)
		}
		return err
	})
	return out, err
}

// record returns the stored record of id, or nil.
func (s *store) record(id sandbox.ID) (*record, error) {
	var r *record
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketSandboxes).Get([]byte(id))
		if raw == nil {
			return nil
		}
		r = &record{}
		return json.Unmarshal(raw, r)
	})
	return r, err
}

func (s *store) records() (map[sandbox.ID]*record, error) {
	out := map[sandbox.ID]*record{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).ForEach(func(k, v []byte) error {
			var r record
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode record %s: %w", k, err)
			}
			out[r.ID] = &r
			return nil
		})
	})
	return out, err
}

// appendEvents adds events to their sandboxes' logs in one transaction.
func (s *store) appendEvents(items []eventItem) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEvents)
		logs := map[sandbox.ID][]sandbox.Event{}
		for _, it := range items {
			if it.flushed != nil {
				continue
			}
			evs, ok := logs[it.id]
			if !ok {
				if raw := b.Get([]byte(it.id)); raw != nil {
					if err := json.Unmarshal(raw, &evs); err != nil {
						evs = nil // a damaged log restarts rather than blocking new events
					}
				}
			}
			evs = append(evs, it.ev)
			if len(evs) > maxEvents {
				evs = evs[len(evs)-maxEvents:]
			}
			logs[it.id] = evs
		}
		for id, evs := range logs {
			if err := put(tx, bucketEvents, string(id), evs); err != nil {
				return err
			}
		}
		return nil
	})
}

// eventItem is an event waiting to be written, or, with flushed set, a
// marker that is acknowledged once everything before it is written.
type eventItem struct {
	id      sandbox.ID
	ev      sandbox.Event
	flushed chan struct{}
}

// eventLog writes events in the order they happen, off the paths that
// report them (which may hold the index's lock, so adding never blocks),
// batching what accumulates into one transaction.
type eventLog struct {
	st    *store
	mu    sync.Mutex
	queue []eventItem
	wake  chan struct{} // capacity 1: a pending wake-up
	stop  chan struct{}
	done  chan struct{}
}

func newEventLog(st *store, onError func(error)) *eventLog {
	l := &eventLog{st: st, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.wake:
			case <-l.stop:
				l.writeQueued(onError)
				return
			}
			l.writeQueued(onError)
		}
	}()
	return l
}

func (l *eventLog) writeQueued(onError func(error)) {
	l.mu.Lock()
	batch := l.queue
	l.queue = nil
	l.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	if err := l.st.appendEvents(batch); err != nil {
		onError(err)
	}
	for _, it := range batch {
		if it.flushed != nil {
			close(it.flushed)
		}
	}
}

func (l *eventLog) push(it eventItem) {
	l.mu.Lock()
	l.queue = append(l.queue, it)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *eventLog) add(id sandbox.ID, ev sandbox.Event) { l.push(eventItem{id: id, ev: ev}) }

// flush returns once every event added before it is written.
func (l *eventLog) flush() {
	ch := make(chan struct{})
	l.push(eventItem{flushed: ch})
	select {
	case <-ch:
	case <-l.done:
	}
}

// close writes what is queued and stops.
func (l *eventLog) close() {
	close(l.stop)
	<-l.done
}

func (s *store) events(id sandbox.ID) ([]sandbox.Event, error) {
	var evs []sandbox.Event
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketEvents).Get([]byte(id))
		if raw == nil {
			return nil
		}
		return json.Unmarshal(raw, &evs)
	})
	return evs, err
}

func (s *store) putSnapshot(r *snapshotRecord) error {
	return s.db.Update(func(tx *bolt.Tx) error { return put(tx, bucketSnapshots, string(r.ID), r) })
}

func (s *store) snapshot(id sandbox.SnapshotID) (*snapshotRecord, error) {
	var r *snapshotRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketSnapshots).Get([]byte(id))
		if raw == nil {
			return nil
		}
		r = &snapshotRecord{}
		return json.Unmarshal(raw, r)
	})
	return r, err
}

func (s *store) snapshots() ([]*snapshotRecord, error) {
	var out []*snapshotRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).ForEach(func(k, v []byte) error {
			var r snapshotRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode snapshot %s: %w", k, err)
			}
			out = append(out, &r)
			return nil
		})
	})
	return out, err
}

func (s *store) deleteSnapshot(id sandbox.SnapshotID) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketSnapshots).Delete([]byte(id)) })
}

func (s *store) putPool(p *sandbox.Pool) error {
	return s.db.Update(func(tx *bolt.Tx) error { return put(tx, bucketPools, p.Name, p) })
}

func (s *store) deletePool(name string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketPools).Delete([]byte(name)) })
}

func (s *store) pools() ([]*sandbox.Pool, error) {
	var out []*sandbox.Pool
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPools).ForEach(func(k, v []byte) error {
			var p sandbox.Pool
			if err := json.Unmarshal(v, &p); err != nil {
				return fmt.Errorf("decode pool %s: %w", k, err)
			}
			out = append(out, &p)
			return nil
		})
	})
	return out, err
}
