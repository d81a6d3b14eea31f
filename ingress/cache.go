package ingress

import (
	"context"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// resolveTimeout bounds one resolver call made for the cache; it runs
// apart from the request that asked (others may wait for its answer).
const resolveTimeout = 10 * time.Second

// targetKey is a sandbox's port.
type targetKey struct {
	id   string
	port int
}

// cacheEntry is one resolver answer, or the call that will give it
// (done open).
type cacheEntry struct {
	done    chan struct{}
	target  api.IngressTarget
	err     error
	expires time.Time
}

// targetCache keeps the resolver's answers for a short while, so that a
// burst of requests to one sandbox asks once, and concurrent asks for
// the same port share one call.
type targetCache struct {
	resolver Resolver
	ttl      time.Duration // found
	negTTL   time.Duration // not found, or the resolver failed

	mu        sync.Mutex
	entries   map[targetKey]*cacheEntry
	lastSweep time.Time
}

func newTargetCache(r Resolver, ttl time.Duration) *targetCache {
	neg := ttl / 4
	return &targetCache{resolver: r, ttl: ttl, negTTL: neg, entries: map[targetKey]*cacheEntry{}}
}

// get answers the target of id's port from the cache, or asks the
// resolver, once for all concurrent callers.
func (c *targetCache) get(ctx context.Context, id string, port int) (api.IngressTarget, error) {
	if c.ttl <= 0 {
		return c.resolver.Target(ctx, id, port)
	}
	key := targetKey{id, port}
	now := time.Now()
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok {
		select {
		case <-e.done:
			if now.Before(e.expires) {
				c.mu.Unlock()
				return e.target, e.err
			}
			ok = false // stale: ask again
		default: // in flight: wait for it below
		}
	}
	if !ok {
		e = &cacheEntry{done: make(chan struct{})}
		c.entries[key] = e
		c.sweepLocked(now)
		c.mu.Unlock()
		go c.fetch(context.WithoutCancel(ctx), key, e)
	} else {
		c.mu.Unlock()
	}
	select {
	case <-e.done:
		return e.target, e.err
	case <-ctx.Done():
		return api.IngressTarget{}, ctx.Err()
	}
}

// fetch asks the resolver for key and publishes the answer in e.
func (c *targetCache) fetch(ctx context.Context, key targetKey, e *cacheEntry) {
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	t, err := c.resolver.Target(ctx, key.id, key.port)
	ttl := c.ttl
	if err != nil {
		ttl = c.negTTL
	}
	c.mu.Lock()
	e.target, e.err, e.expires = t, err, time.Now().Add(ttl)
	close(e.done)
	c.mu.Unlock()
}

// sweepLocked drops expired answers, at most once a second.
func (c *targetCache) sweepLocked(now time.Time) {
	if now.Sub(c.lastSweep) < time.Second {
		return
	}
	c.lastSweep = now
	for k, e := range c.entries {
		select {
		case <-e.done:
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		default:
		}
	}
}

// renewThrottle remembers, per sandbox, when the gateway may ask for a
// renew-on-access next.
type renewThrottle struct {
	mu   sync.Mutex
	next map[string]time.Time
}

// renewSweep is the size from which claim drops stale entries.
const renewSweep = 1024

// claim reports whether id is due at now, and if so holds it off until
// hold.
func (t *renewThrottle) claim(id string, now, hold time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if next, ok := t.next[id]; ok && now.Before(next) {
		return false
	}
	if len(t.next) >= renewSweep {
		for k, next := range t.next {
			if !now.Before(next) {
				delete(t.next, k)
			}
		}
	}
	t.next[id] = hold
	return true
}

// forget makes id due again.
func (t *renewThrottle) forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.next, id)
}
