package execd

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

// BenchmarkTrueRoundTrip measures POST /command of `true` over loopback
// HTTP: fork, exec, wait and the whole event stream.
func BenchmarkTrueRoundTrip(b *testing.B) {
	_, c := newTestServer(b, nil)
	for b.Loop() {
		resp, err := c.hc.Do(c.request("POST", "/command", api.RunCommandRequest{Command: "true"}))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkStdoutStream measures streaming 100 MB of output in lines of
// the given length, decoded the way a client does.
func BenchmarkStdoutStream(b *testing.B) {
	for _, lineLen := range []int{76, 1000, 8000} {
		b.Run(fmt.Sprintf("line=%d", lineLen), func(b *testing.B) {
			_, c := newTestServer(b, nil)
			const total = 100_000_000
			lines := total / lineLen
			cmd := fmt.Sprintf("yes %s | head -n %d", strings.Repeat("x", lineLen-1), lines)
			b.SetBytes(int64(lines * lineLen))
			for b.Loop() {
				resp, err := c.hc.Do(c.request("POST", "/command", api.RunCommandRequest{Command: cmd}))
				if err != nil {
					b.Fatal(err)
				}
				dec := api.NewEventDecoder(resp.Body)
				n := 0
				for {
					ev, err := dec.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					if ev.Type == api.EventStdout {
						n += len(ev.Text) + 1
					}
				}
				resp.Body.Close()
				if n != lines*lineLen {
					b.Fatalf("read %d bytes, want %d", n, lines*lineLen)
				}
			}
		})
	}
}
