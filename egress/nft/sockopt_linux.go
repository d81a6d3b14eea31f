package nft

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/egress"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h.
const ip6tSOOriginalDst = 80

// OriginalDst returns where a connection redirected to the transparent
// proxy was going: SO_ORIGINAL_DST for IPv4 (also on an IPv6 socket that
// carries IPv4), IP6T_SO_ORIGINAL_DST for IPv6.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	local, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: local address %v is not TCP", c.LocalAddr())
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	v4 := local.AddrPort().Addr().Unmap().Is4()
	var (
		dst    netip.AddrPort
		sysErr error
	)
	err = raw.Control(func(fd uintptr) {
		if v4 {
			var sa unix.RawSockaddrInet4
			if sysErr = getsockopt(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unix.SizeofSockaddrInet4); sysErr == nil {
				dst = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), ntohs(sa.Port))
			}
			return
		}
		var sa unix.RawSockaddrInet6
		if sysErr = getsockopt(int(fd), unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa), unix.SizeofSockaddrInet6); sysErr == nil {
			dst = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), ntohs(sa.Port))
		}
	})
	if err == nil {
		err = sysErr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination of %v: %w", c.RemoteAddr(), err)
	}
	return dst, nil
}

// ntohs reads a port as the kernel stores it in a sockaddr.
func ntohs(p uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], p)
	return binary.BigEndian.Uint16(b[:])
}

// getsockopt reads a socket option of size bytes into p.
func getsockopt(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	n := uint32(size)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// MarkControl marks a socket with egress.Mark, so that the namespace's
// rules let its packets through untouched. Use it as the Control of
// osb-egress's own net.Dialer and net.ListenConfig (DNS upstream queries,
// connections the proxy dials). It needs CAP_NET_ADMIN.
func MarkControl(network, address string, c syscall.RawConn) error {
	var sysErr error
	err := c.Control(func(fd uintptr) {
		sysErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, egress.Mark)
	})
	if err == nil {
		err = sysErr
	}
	if err != nil {
		return fmt.Errorf("mark %s socket for %s: %w", network, address, err)
	}
	return nil
}
