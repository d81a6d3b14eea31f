package proxy

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"
)

// sendBlocks writes n bytes to w: a random block repeated, each copy
// stamped with its index so that a lost or repeated block changes the
// checksum. It returns the CRC-32C of what it wrote.
func sendBlocks(w io.Writer, n int64) (uint32, error) {
	block := make([]byte, 1<<20)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(block)
	table := crc32.MakeTable(crc32.Castagnoli)
	var sum uint32
	for i := int64(0); n > 0; i++ {
		binary.LittleEndian.PutUint64(block, uint64(i))
		b := block[:min(int64(len(block)), n)]
		if _, err := w.Write(b); err != nil {
			return sum, err
		}
		sum = crc32.Update(sum, table, b)
		n -= int64(len(b))
	}
	return sum, nil
}

// receive reads r to EOF and returns the byte count and CRC-32C.
func receive(r io.Reader) (int64, uint32, error) {
	buf := make([]byte, 256<<10)
	table := crc32.MakeTable(crc32.Castagnoli)
	var sum uint32
	var total int64
	for {
		n, err := r.Read(buf)
		sum = crc32.Update(sum, table, buf[:n])
		total += int64(n)
		if err == io.EOF {
			return total, sum, nil
		}
		if err != nil {
			return total, sum, err
		}
	}
}

// TestLargeTransfer moves 1 GiB each way through the proxy and checks
// that every byte arrives, in order.
func TestLargeTransfer(t *testing.T) {
	size := int64(1 << 30)
	if testing.Short() {
		size = 64 << 20
	}
	h := newHarness(t, nil)
	port, ls := listenSamePort(t, addrOther)
	dst := netip.AddrPortFrom(addrOther, port)
	h.learned.learn("allowed.test", addrOther)
	type result struct {
		n    int64
		sum  uint32
		sent uint32
		err  error
	}
	done := make(chan result, 1)
	serve(t, ls[0], func(c net.Conn) {
		c.SetDeadline(time.Time{}) // the test's own deadline bounds it
		br := bufio.NewReader(c)
		if _, err := br.ReadString('\n'); err != nil {
			done <- result{err: err}
			return
		}
		// Download and upload at the same time, as a full-duplex stream.
		sent := make(chan result, 1)
		go func() {
			s, err := sendBlocks(c, size)
			if err == nil {
				err = c.(*net.TCPConn).CloseWrite()
			}
			sent <- result{sent: s, err: err}
		}()
		n, sum, err := receive(br)
		s := <-sent
		if err == nil {
			err = s.err
		}
		done <- result{n: n, sum: sum, sent: s.sent, err: err}
	})

	c := h.dial(dst)
	c.SetDeadline(time.Now().Add(10 * time.Minute))
	start := time.Now()
	if _, err := io.WriteString(c, "\x00go\n"); err != nil {
		t.Fatal(err)
	}
	upload := make(chan result, 1)
	go func() {
		s, err := sendBlocks(c, size)
		if err == nil {
			err = c.CloseWrite()
		}
		upload <- result{sent: s, err: err}
	}()
	n, sum, err := receive(c)
	if err != nil {
		t.Fatalf("download: %v after %d bytes", err, n)
	}
	up := <-upload
	if up.err != nil {
		t.Fatalf("upload: %v", up.err)
	}
	srv := <-done
	if srv.err != nil {
		t.Fatalf("server: %v", srv.err)
	}
	if n != size || sum != srv.sent {
		t.Fatalf("download: %d bytes, crc %08x; server sent %d bytes, crc %08x", n, sum, size, srv.sent)
	}
	if srv.n != size || srv.sum != up.sent {
		t.Fatalf("upload: server got %d bytes, crc %08x; client sent %d bytes, crc %08x", srv.n, srv.sum, size, up.sent)
	}
	t.Logf("%d MiB each way in %v", size>>20, time.Since(start).Round(time.Millisecond))
}

// benchEnv is a quiet proxy and an echo/download server on addrOther,
// learned for allowed.test, and the address a client binds to be seen by
// the proxy as connecting to that server.
type benchEnv struct {
	proxyAddr string
	dst       netip.AddrPort
	src       *net.TCPAddr
}

func newBenchEnv(b *testing.B, handle func(net.Conn)) benchEnv {
	h := newHarness(b, func(c *Config) { c.Logger = slog.New(slog.DiscardHandler) })
	port, ls := listenSamePort(b, addrOther)
	dst := netip.AddrPortFrom(addrOther, port)
	h.learned.learn("allowed.test", addrOther)
	serve(b, ls[0], handle)
	src := netip.MustParseAddr("127.98.0.1")
	h.mu.Lock()
	h.dsts[src] = dst
	h.mu.Unlock()
	return benchEnv{proxyAddr: h.addr, dst: dst, src: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
}

// dial connects directly to the server or through the proxy.
func (e benchEnv) dial(b *testing.B, viaProxy bool) net.Conn {
	d := net.Dialer{LocalAddr: e.src}
	addr := e.dst.String()
	if viaProxy {
		addr = e.proxyAddr
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkConnSetup measures connect, one request and its answer, and
// close: directly, through the proxy as opaque TCP to a learned address,
// and through the proxy as an HTTP request by name.
func BenchmarkConnSetup(b *testing.B) {
	cases := []struct {
		name     string
		viaProxy bool
		request  string
	}{
		{"direct", false, "\x00ping\n"},
		{"proxy-tcp", true, "\x00ping\n"},
		{"proxy-http", true, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			e := newBenchEnv(b, func(conn net.Conn) {
				buf := make([]byte, 512)
				if _, err := conn.Read(buf); err == nil {
					io.WriteString(conn, "pong\n")
				}
			})
			b.ReportAllocs()
			for b.Loop() {
				conn := e.dial(b, c.viaProxy)
				if _, err := io.WriteString(conn, c.request); err != nil {
					b.Fatal(err)
				}
				if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || line != "pong\n" {
					b.Fatalf("answer %q, %v", line, err)
				}
				conn.Close()
			}
		})
	}
}

// BenchmarkThroughput measures one 256 MiB download, directly and
// through the proxy.
func BenchmarkThroughput(b *testing.B) {
	const size = 256 << 20
	for _, viaProxy := range []bool{false, true} {
		name := "direct"
		if viaProxy {
			name = "proxy"
		}
		b.Run(name, func(b *testing.B) {
			e := newBenchEnv(b, func(conn net.Conn) {
				conn.SetDeadline(time.Time{})
				buf := make([]byte, 4)
				if _, err := io.ReadFull(conn, buf); err != nil {
					return
				}
				block := make([]byte, 256<<10)
				for sent := 0; sent < size; sent += len(block) {
					if _, err := conn.Write(block); err != nil {
						return
					}
				}
			})
			b.SetBytes(size)
			for b.Loop() {
				conn := e.dial(b, viaProxy)
				io.WriteString(conn, "\x00go\n")
				n, _, err := receive(conn)
				conn.Close()
				if err != nil || n != size {
					b.Fatalf("received %d bytes, %v", n, err)
				}
			}
		})
	}
}

func ExampleNew() {
	p, err := New(Config{
		Decider: allowNothing{},
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) {
			return netip.AddrPort{}, fmt.Errorf("not redirected")
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	fmt.Println(p.Active())
	// Output: 0
}

// allowNothing is a Decider that refuses everything.
type allowNothing struct{}

func (allowNothing) Name(string) bool         { return false }
func (allowNothing) Resolved(netip.Addr) bool { return false }
func (allowNothing) Addr(netip.Addr) bool     { return false }
