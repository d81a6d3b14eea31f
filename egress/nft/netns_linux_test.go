package nft

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// netNS is a network namespace the test made with `ip netns add`; it is
// deleted when the test ends.
type netNS struct {
	name string
	f    *os.File
}

var nsSeq atomic.Int32

// newNetNS makes a namespace with its loopback up. Names carry the pid so
// that parallel test binaries never collide.
func newNetNS(t *testing.T, role string) *netNS {
	t.Helper()
	testenv.MustHaveRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		testenv.Missing(t, "the ip command (iproute2) is needed to set up namespaces")
	}
	name := fmt.Sprintf("osbnft-%d-%d-%s", os.Getpid(), nsSeq.Add(1), role)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		t.Fatalf("open namespace %s: %v", name, err)
	}
	t.Cleanup(func() { f.Close() })
	n := &netNS{name: name, f: f}
	n.ip(t, "link", "set", "lo", "up")
	return n
}

// ip runs `ip -n <ns> args...`.
func (n *netNS) ip(t *testing.T, args ...string) {
	t.Helper()
	args = append([]string{"-n", n.name}, args...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// do runs f on an OS thread switched into the namespace. Sockets f opens
// belong to the namespace for their whole life, whoever uses them later.
// The thread is never switched back: its goroutine ends locked, so the
// Go runtime throws the thread away.
func (n *netNS) do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter namespace %s: %w", n.name, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// must is do for setup steps that cannot fail.
func (n *netNS) must(t *testing.T, f func() error) {
	t.Helper()
	if err := n.do(f); err != nil {
		t.Fatal(err)
	}
}
