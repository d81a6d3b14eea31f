package dnsproxy

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// clock is a settable time source for Table.now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTestTable(size int) (*Table, *clock) {
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	t := NewTable(size)
	t.now = c.Now
	return t, c
}

func TestTableLookups(t *testing.T) {
	tab, _ := newTestTable(0)
	a, b := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	tab.Learn("WWW.Example.TEST.", []netip.Addr{a, b}, time.Minute)
	tab.Learn("cdn.test", []netip.Addr{a}, time.Minute)

	if got := tab.Names(a); !slices.Equal(got, []string{"cdn.test", "www.example.test"}) {
		t.Errorf("Names(%v) = %v", a, got)
	}
	if got := tab.Names(b); !slices.Equal(got, []string{"www.example.test"}) {
		t.Errorf("Names(%v) = %v", b, got)
	}
	if got := tab.Names(netip.MustParseAddr("198.51.100.3")); len(got) != 0 {
		t.Errorf("Names of an unknown address = %v", got)
	}
	for _, c := range []struct {
		name string
		addr netip.Addr
		want bool
	}{
		{"www.example.test", a, true},
		{"www.example.test.", b, true},
		{"WWW.EXAMPLE.TEST", a, true},
		{"cdn.test", a, true},
		{"cdn.test", b, false},
		{"other.test", a, false},
		{"www.example.test", netip.MustParseAddr("::ffff:198.51.100.1"), true},
	} {
		if got := tab.Has(c.name, c.addr); got != c.want {
			t.Errorf("Has(%q, %v) = %v, want %v", c.name, c.addr, got, c.want)
		}
	}
}

func TestTableMappedAddressesStoredUnmapped(t *testing.T) {
	tab, _ := newTestTable(0)
	tab.Learn("v6.test", []netip.Addr{netip.MustParseAddr("::ffff:203.0.113.7")}, time.Minute)
	if !tab.Has("v6.test", netip.MustParseAddr("203.0.113.7")) {
		t.Error("IPv4-mapped address not found by its IPv4 form")
	}
	if got := tab.Names(netip.MustParseAddr("203.0.113.7")); !slices.Equal(got, []string{"v6.test"}) {
		t.Errorf("Names = %v", got)
	}
}

func TestTableExpiry(t *testing.T) {
	tab, clk := newTestTable(0)
	a := netip.MustParseAddr("198.51.100.1")
	tab.Learn("zero.test", []netip.Addr{a}, 0)
	tab.Learn("minute.test", []netip.Addr{a}, 90*time.Second)
	tab.Learn("day.test", []netip.Addr{a}, 24*time.Hour)

	check := func(when string, want ...string) {
		t.Helper()
		if got := tab.Names(a); !slices.Equal(got, want) {
			t.Errorf("%s: Names = %v, want %v", when, got, want)
		}
	}
	check("at once", "day.test", "minute.test", "zero.test")
	clk.Advance(MinTTL - time.Second)
	check("just before the floor", "day.test", "minute.test", "zero.test")
	clk.Advance(2 * time.Second)
	check("just after the floor", "day.test", "minute.test")
	if tab.Has("zero.test", a) {
		t.Error("Has(zero.test) after its floor")
	}
	clk.Advance(time.Minute)
	check("after 91s", "day.test")
	clk.Advance(MaxTTL)
	check("after the cap")

	// Learning again keeps the later expiry.
	tab, clk = newTestTable(0)
	tab.Learn("again.test", []netip.Addr{a}, 10*time.Minute)
	clk.Advance(time.Minute)
	tab.Learn("again.test", []netip.Addr{a}, 0)
	clk.Advance(5 * time.Minute)
	if !tab.Has("again.test", a) {
		t.Error("a shorter TTL learned later cut the first one short")
	}
	clk.Advance(5 * time.Minute)
	if tab.Has("again.test", a) {
		t.Error("pair outlived both TTLs")
	}
}

func TestTableExpiredPairsDropped(t *testing.T) {
	tab, clk := newTestTable(0)
	for i := range 10 {
		tab.Learn(fmt.Sprintf("n%d.test", i), []netip.Addr{netip.MustParseAddr("198.51.100.1")}, 0)
	}
	clk.Advance(MinTTL + time.Second)
	tab.Learn("fresh.test", []netip.Addr{netip.MustParseAddr("198.51.100.2")}, 0)
	if n := tab.Len(); n != 1 {
		t.Errorf("Len = %d after the others expired, want 1", n)
	}
}

func TestTableSizeBound(t *testing.T) {
	tab, _ := newTestTable(4)
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}) }
	tab.Learn("a.test", []netip.Addr{addr(1), addr(2)}, time.Hour)
	tab.Learn("b.test", []netip.Addr{addr(3)}, time.Hour)
	tab.Learn("c.test", []netip.Addr{addr(4)}, time.Hour)
	// a.test/1 is learned again: now the most recent.
	tab.Learn("a.test", []netip.Addr{addr(1)}, time.Hour)
	tab.Learn("d.test", []netip.Addr{addr(5), addr(6)}, time.Hour)

	if n := tab.Len(); n != 4 {
		t.Errorf("Len = %d, want 4", n)
	}
	for _, c := range []struct {
		name string
		i    int
		want bool
	}{
		{"a.test", 2, false}, // oldest
		{"b.test", 3, false}, // next oldest
		{"c.test", 4, true},
		{"a.test", 1, true},
		{"d.test", 5, true},
		{"d.test", 6, true},
	} {
		if got := tab.Has(c.name, addr(c.i)); got != c.want {
			t.Errorf("Has(%s, %v) = %v, want %v", c.name, addr(c.i), got, c.want)
		}
	}
	if got := tab.Names(addr(2)); len(got) != 0 {
		t.Errorf("Names of an evicted address = %v", got)
	}

	big := NewTable(0)
	for i := range DefaultTableSize + 100 {
		big.Learn("many.test", []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}, time.Hour)
	}
	if n := big.Len(); n != DefaultTableSize {
		t.Errorf("default table Len = %d, want %d", n, DefaultTableSize)
	}
}

func TestTableIgnoresEmpty(t *testing.T) {
	tab, _ := newTestTable(0)
	tab.Learn("", []netip.Addr{netip.MustParseAddr("198.51.100.1")}, time.Minute)
	tab.Learn("none.test", nil, time.Minute)
	tab.Learn("invalid.test", []netip.Addr{{}}, time.Minute)
	if n := tab.Len(); n != 0 {
		t.Errorf("Len = %d, want 0", n)
	}
}

func TestTableConcurrent(t *testing.T) {
	tab := NewTable(1000)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				a := netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})
				name := fmt.Sprintf("w%d.test", w)
				tab.Learn(name, []netip.Addr{a}, time.Minute)
				tab.Has(name, a)
				tab.Names(a)
			}
		})
	}
	wg.Wait()
	if n := tab.Len(); n > 1000 {
		t.Errorf("Len = %d over the bound", n)
	}
}
