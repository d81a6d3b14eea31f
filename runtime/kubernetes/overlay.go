package kubernetes

import (
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// overlay holds the objects this replica wrote until its informer has
// caught up with them, so that a read after a write sees the write: a
// Get right after Create finds the pod, a Get after PatchMetadata sees the
// patch, and a Get after Delete does not find the pod. It is a cache of
// the cluster, never a record of its own: every entry goes away once the
// informer delivers that version or a newer one, or after overlayTTL.
type overlay[T metav1.Object] struct {
	mu      sync.Mutex
	written map[string]overlayEntry[T]
	// deleted holds names this replica deleted (with the UID deleted, if
	// known), until the informer saw them go.
	deleted map[string]deletion
}

type deletion struct {
	uid types.UID
	at  time.Time
}

type overlayEntry[T metav1.Object] struct {
	obj T
	at  time.Time
}

// overlayTTL bounds how long an entry stays when the informer never
// delivers it (the object was deleted by someone else meanwhile).
const overlayTTL = time.Minute

func newOverlay[T metav1.Object]() *overlay[T] {
	return &overlay[T]{written: map[string]overlayEntry[T]{}, deleted: map[string]deletion{}}
}

// wrote records an object returned by a create, an update or a read. A
// write that finishes after this replica deleted the object (an update
// under way while a delete went through) does not bring it back; a new
// object of the same name (another UID) does.
func (o *overlay[T]) wrote(obj T) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if d, ok := o.deleted[obj.GetName()]; ok && (d.uid == "" || d.uid == obj.GetUID()) {
		return
	}
	if cur, ok := o.written[obj.GetName()]; ok && newer(cur.obj, obj) {
		return
	}
	o.written[obj.GetName()] = overlayEntry[T]{obj: obj, at: time.Now()}
	delete(o.deleted, obj.GetName())
}

// removed records that name (of uid, if known) was deleted.
func (o *overlay[T]) removed(name string, uid types.UID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.written, name)
	o.deleted[name] = deletion{uid: uid, at: time.Now()}
}

// seen is called with every object the informer delivers: a written
// entry it has caught up with is dropped.
func (o *overlay[T]) seen(obj T) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if cur, ok := o.written[obj.GetName()]; ok && !newer(cur.obj, obj) {
		delete(o.written, obj.GetName())
	}
}

// gone is called when the informer delivers a deletion.
func (o *overlay[T]) gone(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.written, name)
	delete(o.deleted, name)
}

// resolve returns the freshest view of name given the informer's copy
// (cached, ok). It reports false when the object is deleted or unknown.
func (o *overlay[T]) resolve(name string, cached T, ok bool) (T, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var zero T
	if _, del := o.deleted[name]; del {
		return zero, false
	}
	if e, w := o.written[name]; w && (!ok || newer(e.obj, cached)) {
		return e.obj, true
	}
	return cached, ok
}

// extra returns written objects the informer does not have yet.
func (o *overlay[T]) extra(has func(name string) bool) []T {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []T
	for name, e := range o.written {
		if !has(name) {
			out = append(out, e.obj)
		}
	}
	return out
}

// isDeleted reports whether this replica deleted name and the informer
// has not seen it go yet.
func (o *overlay[T]) isDeleted(name string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.deleted[name]
	return ok
}

// expire drops entries older than overlayTTL.
func (o *overlay[T]) expire(now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for name, e := range o.written {
		if now.Sub(e.at) > overlayTTL {
			delete(o.written, name)
		}
	}
	for name, d := range o.deleted {
		if now.Sub(d.at) > overlayTTL {
			delete(o.deleted, name)
		}
	}
}

// newer reports whether a is a later version than b. Resource versions
// are opaque in general, but integers that grow with every write on the
// API servers this runtime supports (etcd-backed); when either is not an
// integer, the informer's copy wins.
func newer(a, b metav1.Object) bool {
	ra, errA := strconv.ParseUint(a.GetResourceVersion(), 10, 64)
	rb, errB := strconv.ParseUint(b.GetResourceVersion(), 10, 64)
	return errA == nil && errB == nil && ra > rb
}
