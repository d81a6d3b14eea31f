//go:build !linux

package nft

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// ErrClosed is returned by the methods of a closed Table.
var ErrClosed = errors.New("nftables table is closed")

// Table is the namespace's egress table; it exists on Linux only.
type Table struct{}

// Open returns ErrUnsupported.
func Open() (*Table, error) { return nil, ErrUnsupported }

// Close returns ErrUnsupported.
func (t *Table) Close() error { return ErrUnsupported }

// Remove returns ErrUnsupported.
func (t *Table) Remove() error { return ErrUnsupported }

// Apply returns ErrUnsupported.
func (t *Table) Apply(cfg Config) error { return ErrUnsupported }

// Learn returns ErrUnsupported.
func (t *Table) Learn(addrs []netip.Addr, ttl time.Duration) error { return ErrUnsupported }

// Learned returns ErrUnsupported.
func (t *Table) Learned() ([]netip.Addr, error) { return nil, ErrUnsupported }

// OriginalDst returns ErrUnsupported.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) { return netip.AddrPort{}, ErrUnsupported }

// MarkControl returns ErrUnsupported.
func MarkControl(network, address string, c syscall.RawConn) error { return ErrUnsupported }
