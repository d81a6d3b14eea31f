package dnsproxy

import (
	"container/list"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// MinTTL is the shortest time a Table remembers an address, whatever the
// answer's TTL (0 included): long enough for the client that asked to
// connect.
const MinTTL = 30 * time.Second

// DefaultTableSize is the number of (name, address) pairs a Table made
// with size 0 holds.
const DefaultTableSize = 65536

// Table remembers which allowed names resolved to which addresses, for
// as long as the answers' TTLs say (at least MinTTL, at most MaxTTL). It
// holds a bounded number of (name, address) pairs; when full, the pair
// learned least recently goes first. Names are kept lower case without a
// trailing dot, addresses unmapped (an IPv4-mapped IPv6 address is stored
// as the IPv4 address it maps). Table is safe for concurrent use; its
// Learn method fits Config.Learn.
type Table struct {
	now func() time.Time

	mu      sync.RWMutex
	max     int
	order   *list.List // of *pair, least recently learned first
	pairs   map[pairKey]*list.Element
	perAddr map[netip.Addr]map[string]*list.Element
}

type pairKey struct {
	name string
	addr netip.Addr
}

type pair struct {
	pairKey
	expires time.Time
}

// NewTable returns an empty Table holding at most size pairs
// (DefaultTableSize when size <= 0).
func NewTable(size int) *Table {
	if size <= 0 {
		size = DefaultTableSize
	}
	return &Table{
		now:     time.Now,
		max:     size,
		order:   list.New(),
		pairs:   make(map[pairKey]*list.Element),
		perAddr: make(map[netip.Addr]map[string]*list.Element),
	}
}

// Learn records that name resolved to addrs, valid for ttl (raised to
// MinTTL, lowered to MaxTTL). A pair learned again keeps the later of
// its two expiry times.
func (t *Table) Learn(name string, addrs []netip.Addr, ttl time.Duration) {
	name = normName(name)
	if name == "" || len(addrs) == 0 {
		return
	}
	now := t.now()
	expires := now.Add(min(max(ttl, MinTTL), MaxTTL))

	t.mu.Lock()
	defer t.mu.Unlock()
	for _, a := range addrs {
		if !a.IsValid() {
			continue
		}
		k := pairKey{name, normAddr(a)}
		if e, ok := t.pairs[k]; ok {
			p := e.Value.(*pair)
			p.expires = later(p.expires, expires)
			t.order.MoveToBack(e)
			continue
		}
		e := t.order.PushBack(&pair{pairKey: k, expires: expires})
		t.pairs[k] = e
		byName := t.perAddr[k.addr]
		if byName == nil {
			byName = make(map[string]*list.Element)
			t.perAddr[k.addr] = byName
		}
		byName[name] = e
	}
	// Drop the oldest pairs over the bound, and the expired ones at the
	// front, which no lookup would return anyway.
	for e := t.order.Front(); e != nil; e = t.order.Front() {
		if t.order.Len() <= t.max && e.Value.(*pair).expires.After(now) {
			break
		}
		t.removeLocked(e)
	}
}

func (t *Table) removeLocked(e *list.Element) {
	p := t.order.Remove(e).(*pair)
	delete(t.pairs, p.pairKey)
	byName := t.perAddr[p.addr]
	delete(byName, p.name)
	if len(byName) == 0 {
		delete(t.perAddr, p.addr)
	}
}

// Names returns, sorted, the names that resolved to a and have not
// expired.
func (t *Table) Names(a netip.Addr) []string {
	a = normAddr(a)
	now := t.now()
	t.mu.RLock()
	defer t.mu.RUnlock()
	var names []string
	for name, e := range t.perAddr[a] {
		if e.Value.(*pair).expires.After(now) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// Has reports whether name resolved to a and that has not expired.
func (t *Table) Has(name string, a netip.Addr) bool {
	k := pairKey{normName(name), normAddr(a)}
	now := t.now()
	t.mu.RLock()
	defer t.mu.RUnlock()
	e, ok := t.pairs[k]
	return ok && e.Value.(*pair).expires.After(now)
}

// Len is the number of pairs held, expired ones not yet dropped included.
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.order.Len()
}

func normName(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".")
}

func normAddr(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
