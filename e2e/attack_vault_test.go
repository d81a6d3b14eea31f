package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/standin"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// The credential vault's attempts. The test's internet holds a
// "provider" (provider.test, HTTPS on 443 and 8443, HTTP on 80) that
// notes every request it receives with its headers, and a "hostile"
// server (hostile.test) with a valid certificate of its own for its
// name. osb-egress trusts the test's CA for upstream servers
// (upstream_ca_file); the sandbox trusts only its own proxy's CA. Each
// attempt runs netprobe in the sandbox; what the servers received is read
// on the host, so the secrets never pass through the sandbox to be
// checked.

// providerSeen is one request a stand-in server received.
type providerSeen struct {
	Server string
	Method string
	Path   string
	Proto  string
	Header http.Header
}

// recorder keeps what the stand-in servers received.
type recorder struct {
	mu   sync.Mutex
	seen []providerSeen
}

func (r *recorder) add(server string, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, providerSeen{Server: server, Method: req.Method, Path: req.URL.EscapedPath(), Proto: req.Proto, Header: req.Header.Clone()})
}

func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// since returns the requests received after mark.
func (r *recorder) since(mark int) []providerSeen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen[mark:])
}

// holds reports whether any of the requests carries any of the secrets,
// anywhere in a header.
func holds(seen []providerSeen, secrets ...string) bool {
	for _, s := range seen {
		for _, vs := range s.Header {
			for _, v := range vs {
				for _, sec := range secrets {
					if strings.Contains(v, sec) {
						return true
					}
				}
			}
		}
	}
	return false
}

// providerHandler is the provider's behaviour: /sse streams three events
// 400 ms apart, /ws accepts a WebSocket and answers whether the bearer
// token arrived, /echo sends the token back in a header and the body (for
// redaction), anything else answers "ok".
func providerHandler(name string, rec *recorder, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(name, r)
		switch r.URL.Path {
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				fmt.Fprintf(w, "data: event %d\n\n", i)
				w.(http.Flusher).Flush()
				time.Sleep(400 * time.Millisecond)
			}
		case "/ws":
			got := "auth-missing"
			if r.Header.Get("Authorization") == "Bearer "+token {
				got = "auth-ok"
			}
			sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
				base64.StdEncoding.EncodeToString(sum[:]))
			brw.Flush()
			if _, err := readClientFrame(brw.Reader); err != nil {
				return
			}
			c.Write(append([]byte{0x81, byte(len(got))}, got...))
		case "/echo":
			w.Header().Set("X-Echo", r.Header.Get("Authorization"))
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]string{"authorization": r.Header.Get("Authorization")})
		default:
			io.WriteString(w, "ok "+name)
		}
	})
}

// readClientFrame reads one masked frame of a WebSocket client.
func readClientFrame(r *bufio.Reader) ([]byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := int(h[1] & 0x7f)
	if n > 125 {
		return nil, fmt.Errorf("frame too long")
	}
	var mask [4]byte
	if _, err := io.ReadFull(r, mask[:]); err != nil {
		return nil, err
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, err
	}
	for i := range data {
		data[i] ^= mask[i%4]
	}
	return data, nil
}

// fetchResult is netprobe fetch's detail.
type fetchResult struct {
	Status int                 `json:"status"`
	Proto  string              `json:"proto"`
	Header map[string][]string `json:"header"`
	Body   string              `json:"body"`
	Chunks []struct {
		AtMS int64  `json:"atMs"`
		Data string `json:"data"`
	} `json:"chunks"`
}

func secretValue(prefix string) string {
	b := make([]byte, 12)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// TestAttackVault: a sandbox created with credentialProxy calls its
// provider with keys it never sees; every way of sending a key elsewhere
// or reading it back fails.
func TestAttackVault(t *testing.T) {
	testenv.MustHaveRoot(t)
	testenv.MustHaveImage(t, egressImage)
	network, _ := testNetwork(t)
	n := newEgressNet(t)
	bin, err := os.ReadFile(standin.Netprobe(t))
	if err != nil {
		t.Fatal(err)
	}
	provider := standin.Pick(t, netip.MustParsePrefix("203.0.113.0/24"), 110)
	hostile := standin.Pick(t, netip.MustParsePrefix("203.0.113.0/24"), 120)
	n.sn.Add(provider)
	n.sn.Add(hostile)
	n.dns.Set("provider.test", provider)
	n.dns.Set("hostile.test", hostile)

	tok, user, apiKey, one, two := secretValue("sk-live-"), secretValue("user:"), secretValue("ak-"), secretValue("c1-"), secretValue("c2-")
	basic := base64.StdEncoding.EncodeToString([]byte(user))
	secrets := []string{tok, basic, user, apiKey, one, two}
	rec := &recorder{}
	n.sn.ServeTLSHandler(netip.AddrPortFrom(provider, 443), providerHandler("provider:443", rec, tok))
	n.sn.ServeTLSHandler(netip.AddrPortFrom(provider, 8443), providerHandler("provider:8443", rec, tok))
	n.sn.ServeTLSHandler(netip.AddrPortFrom(hostile, 443), providerHandler("hostile:443", rec, tok))
	plain := &http.Server{Handler: providerHandler("provider:80", rec, tok), ReadHeaderTimeout: time.Minute}
	go plain.Serve(n.sn.Listen(netip.AddrPortFrom(provider, 80)))
	t.Cleanup(func() { plain.Close() })

	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, n.sn.CAPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, serverOptions{
		docker: fmt.Sprintf("network = %q\ndns = [%q]", network, n.resolv),
		extra:  fmt.Sprintf("[egress]\nmode = \"strict\"\ndns_upstreams = [%q]\nupstream_ca_file = %q", n.resolv, caFile),
	})
	policy := json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"provider.test"},{"action":"allow","target":"hostile.test"}]}`)
	req := sandboxRequest(busyboxImage, "sleep", "infinity")
	req.NetworkPolicy = policy
	req.CredentialProxy = &api.CredentialProxy{Enabled: true}
	id := s.create(req)
	plainReq := sandboxRequest(busyboxImage, "sleep", "infinity")
	plainReq.NetworkPolicy = policy
	noProxy := s.create(plainReq)
	s.waitState(id, "Running")
	s.waitState(noProxy, "Running")
	c := s.execd(id)
	c.upload(map[string][]byte{"/tmp/netprobe": bin, "/tmp/test-ca.pem": n.sn.CAPEM()}, map[string]api.FileMetadata{"/tmp/netprobe": {Mode: 755}})
	c.mustRun("chmod 755 /tmp/netprobe")
	fetch := func(args ...string) (fetchResult, string) {
		t.Helper()
		r := c.run("/tmp/netprobe " + strings.Join(args, " "))
		p, err := standin.ParseProbe([]byte(r.stdout))
		if err != nil {
			t.Fatalf("netprobe %v: %v (stdout %q, stderr %q)", args, err, r.stdout, r.stderr)
		}
		var f fetchResult
		if p.OK || strings.HasPrefix(p.Detail, "{") {
			json.Unmarshal([]byte(p.Detail), &f)
		}
		return f, p.Detail
	}

	eg := s.egress(id)
	vault := fmt.Sprintf(`{
		"credentials": [
			{"name":"tok","source":{"type":"inline","value":%q}},
			{"name":"basic","source":{"value":%q}},
			{"name":"key","source":{"value":%q}},
			{"name":"one","source":{"value":%q}},
			{"name":"two","source":{"value":%q}}],
		"bindings": [
			{"name":"bearer","match":{"hosts":["provider.test"],"paths":["/bearer/*","/sse","/ws","/echo"]},"auth":{"type":"bearer","credential":"tok"}},
			{"name":"basic","match":{"hosts":["provider.test"],"paths":["/basic/*"]},"auth":{"type":"basic","credential":"basic"}},
			{"name":"apikey","match":{"hosts":["provider.test"],"paths":["/apikey/*"]},"auth":{"type":"apiKey","name":"x-api-key","credential":"key"}},
			{"name":"custom","match":{"hosts":["provider.test"],"paths":["/custom/*"]},"auth":{"type":"customHeaders","headers":[{"name":"X-One","credential":"one"},{"name":"X-Two","credential":"two"}]}},
			{"name":"getonly","match":{"hosts":["provider.test"],"paths":["/v1/*"],"methods":["GET"]},"auth":{"type":"bearer","credential":"tok"}}]}`,
		tok, basic, apiKey, one, two)
	code, body := eg.do("POST", "/credential-vault", vault)
	if code != 201 {
		t.Fatalf("POST /credential-vault: %d %s", code, body)
	}
	for _, sec := range secrets {
		if strings.Contains(body, sec) {
			t.Fatalf("the vault's answer holds a secret: %s", body)
		}
	}

	// injected sends one request and returns what the provider received.
	injected := func(args ...string) ([]providerSeen, fetchResult, string) {
		t.Helper()
		m := rec.mark()
		f, detail := fetch(args...)
		return rec.since(m), f, detail
	}
	works := []struct {
		name   string
		args   []string
		header string
		want   string
	}{
		{"bearer", []string{"fetch", "https://provider.test/bearer/x"}, "Authorization", "Bearer " + tok},
		{"basic", []string{"fetch", "https://provider.test/basic/x"}, "Authorization", "Basic " + basic},
		{"apiKey", []string{"fetch", "https://provider.test/apikey/x"}, "X-Api-Key", apiKey},
		{"customHeaders (first)", []string{"fetch", "https://provider.test/custom/x"}, "X-One", one},
		{"customHeaders (second)", []string{"fetch", "https://provider.test/custom/x"}, "X-Two", two},
		{"the sandbox's own header of that name is replaced", []string{"fetch", "https://provider.test/bearer/x", "-header", "'Authorization: Bearer sandbox-made'"}, "Authorization", "Bearer " + tok},
		{"over HTTP/2", []string{"fetch", "https://provider.test/bearer/h2", "-h2"}, "Authorization", "Bearer " + tok},
		{"a GET the GET-only binding covers", []string{"fetch", "https://provider.test/v1/models"}, "Authorization", "Bearer " + tok},
	}
	for _, w := range works {
		t.Run("inject: "+w.name, func(t *testing.T) {
			seen, f, detail := injected(w.args...)
			if f.Status != 200 || len(seen) != 1 || seen[0].Server != "provider:443" {
				t.Fatalf("%v: status %d, provider saw %d requests (%s)", w.args, f.Status, len(seen), detail)
			}
			if got := seen[0].Header.Values(w.header); len(got) != 1 || got[0] != w.want {
				t.Fatalf("%s arrived as %d values (want exactly the vault's)", w.header, len(got))
			}
			if w.name == "over HTTP/2" && f.Proto != "HTTP/2.0" {
				t.Errorf("the sandbox spoke %s, want HTTP/2.0", f.Proto)
			}
		})
	}

	hostileIP := hostile.String()
	attempts := []struct {
		name string
		args []string
		// status is what the sandbox must get (0: any, or no answer).
		status int
	}{
		{"a Host that differs from the SNI", []string{"fetch", "https://provider.test/bearer/x", "-host", "hostile.test"}, 421},
		{"domain fronting: the provider's SNI sent to the hostile server's address", []string{"fetch", "https://" + hostileIP + "/bearer/x", "-sni", "provider.test", "-host", "provider.test"}, 0},
		{"the hostile server's SNI with the provider's Host", []string{"fetch", "https://hostile.test/bearer/x", "-host", "provider.test", "-cafile", "/tmp/test-ca.pem"}, 0},
		{"plain HTTP to the provider", []string{"fetch", "http://provider.test/bearer/x"}, 0},
		{"path traversal out of a path-scoped binding", []string{"fetch", "https://provider.test/v1/../admin"}, 0},
		{"encoded path traversal", []string{"fetch", "https://provider.test/v1/%2e%2e/admin"}, 0},
		{"a dot segment with parameters out of a path-scoped binding", []string{"fetch", "https://provider.test/v1/..;/admin"}, 0},
		{"a method the binding does not name", []string{"fetch", "https://provider.test/v1/models", "-method", "DELETE"}, 0},
		{"a port the binding does not name", []string{"fetch", "https://provider.test:8443/bearer/x", "-cafile", "/tmp/test-ca.pem"}, 0},
		{"the hostile server by name", []string{"fetch", "https://hostile.test/bearer/x", "-cafile", "/tmp/test-ca.pem"}, 0},
	}
	denialsBefore := vaultDenials(t, eg)
	for _, a := range attempts {
		attack(t, "vault: "+a.name, func(t *testing.T) string {
			seen, f, detail := injected(a.args...)
			if a.status != 0 && f.Status != a.status {
				t.Errorf("status %d, want %d (%.200s)", f.Status, a.status, detail)
			}
			var wrong []string
			for _, sv := range seen {
				// Only the provider's port 443 may ever get a key: the
				// fronted attempt reaches it (the proxy dials the name),
				// never the hostile server's address.
				if holds([]providerSeen{sv}, secrets...) && (sv.Server != "provider:443" || !strings.Contains(a.name, "fronting")) {
					wrong = append(wrong, sv.Server+" "+sv.Path)
				}
				if sv.Server == "hostile:443" && strings.Contains(a.name, "fronting") {
					wrong = append(wrong, "the hostile server was reached")
				}
			}
			if len(wrong) > 0 {
				t.Errorf("a key went out: %v", wrong)
			}
			return fmt.Sprintf("status %d; servers saw %d request(s), none with a key where it must not be", f.Status, len(seen))
		})
	}
	attack(t, "vault: a request with a key cannot steer the server to another method, path or host", func(t *testing.T) string {
		seen, f, detail := injected("fetch", "https://provider.test/v1/models", "-header", "'X-HTTP-Method-Override: DELETE'",
			"-header", "'X-Original-URL: /admin'", "-header", "'X-Forwarded-Host: hostile.test'", "-header", "'Forwarded: host=hostile.test'")
		if f.Status != 200 || len(seen) != 1 || seen[0].Header.Get("Authorization") != "Bearer "+tok {
			t.Fatalf("the GET did not carry its key: %.300s", detail)
		}
		var kept []string
		for _, k := range []string{"X-Http-Method-Override", "X-Original-Url", "X-Forwarded-Host", "Forwarded"} {
			if v := seen[0].Header.Get(k); v != "" {
				kept = append(kept, k+": "+v)
			}
		}
		if len(kept) > 0 {
			t.Errorf("went upstream with the key: %v", kept)
		}
		return fmt.Sprintf("the provider got the key and %d steering headers", len(kept))
	})
	attack(t, "vault: each refusal is an event", func(t *testing.T) string {
		after := vaultDenials(t, eg)
		got := after[len(denialsBefore):]
		var reasons []string
		for _, d := range got {
			reasons = append(reasons, d.Name+": "+d.Reason)
		}
		// The Host mismatch, plain HTTP, the three traversals, the method
		// and the port; the hostile server by name needs no event (it has
		// no binding).
		if len(got) < 7 {
			t.Errorf("%d vault events after the attempts, want at least 7: %v", len(got), reasons)
		}
		return strings.Join(reasons, "; ")
	})

	t.Run("responses are redacted", func(t *testing.T) {
		f, detail := fetch("fetch", "https://provider.test/echo")
		if f.Status != 200 {
			t.Fatalf("/echo: %s", detail)
		}
		if strings.Contains(detail, tok) {
			t.Fatalf("the token came back to the sandbox: %.300s", detail)
		}
		if got := strings.Join(f.Header["X-Echo"], ","); !strings.Contains(got, "[REDACTED]") {
			t.Errorf("X-Echo %q, want it redacted", got)
		}
		if !strings.Contains(f.Body, "[REDACTED]") {
			t.Errorf("body %q, want the token redacted", f.Body)
		}
	})
	t.Run("server-sent events through a binding arrive one by one", func(t *testing.T) {
		f, detail := fetch("fetch", "https://provider.test/sse", "-timeout", "10s")
		if f.Status != 200 || strings.Count(f.Body, "data: event") != 3 {
			t.Fatalf("/sse: %.300s", detail)
		}
		if len(f.Chunks) < 3 || f.Chunks[0].AtMS > 300 || f.Chunks[len(f.Chunks)-1].AtMS < 600 {
			t.Errorf("events arrived at %+v ms: want the first at once and the last 800 ms later", f.Chunks)
		}
	})
	t.Run("a WebSocket through a binding carries the key", func(t *testing.T) {
		r := c.run("/tmp/netprobe ws wss://provider.test/ws")
		p, err := standin.ParseProbe([]byte(r.stdout))
		if err != nil || !p.OK || !strings.Contains(p.Detail, "auth-ok") {
			t.Fatalf("ws: %+v %v (%s)", p, err, r.stderr)
		}
	})

	attack(t, "vault: the sandbox holds no secret and no CA key (files, environment, command lines, memory)", func(t *testing.T) string {
		// Control: the same search finds what the test put there itself,
		// in a file, an environment and a command line.
		marker := secretValue("control-")
		c.upload(map[string][]byte{"/tmp/control": []byte(marker)}, nil)
		c.stream("/command", api.RunCommandRequest{Command: "sleep 60; : " + marker, Background: true, Envs: map[string]string{"M": marker}})
		testwait.Until(t, "the control process", func() bool {
			return strings.Contains(c.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout, marker)
		}, func() string { return c.run("ps; cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout })
		if got := scanContainer(t, "osb-"+id, []string{marker}); len(got) < 3 {
			t.Fatalf("the search found the control marker in %v only; it cannot be trusted (processes %v)", got, containerPIDs(t, "osb-"+id))
		}
		found := scanContainer(t, "osb-"+id, append(secrets, "BEGIN PRIVATE KEY-----", "BEGIN EC PRIVATE KEY-----"))
		if len(found) > 0 {
			t.Errorf("found: %v", found)
		}
		return fmt.Sprintf("%d places hold a secret (the control marker was found)", len(found))
	})
	attack(t, "vault: no secret in the server's or osb-egress's logs", func(t *testing.T) string {
		logs := s.logs.String() + docker(t, "logs", "osb-"+id+"-egress")
		for _, sec := range secrets {
			if strings.Contains(logs, sec) {
				t.Errorf("a secret in the logs")
			}
		}
		return fmt.Sprintf("%d bytes of logs searched", len(logs))
	})

	t.Run("a killed osb-egress comes back with the vault", func(t *testing.T) {
		worker := egressWorkerPID(t, "osb-"+id+"-egress")
		if err := syscall.Kill(worker, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, "osb-egress to restart", func() bool {
			resp, err := http.Get(eg.base + "/healthz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		}, nil)
		seen, f, detail := injected("fetch", "https://provider.test/bearer/after-crash")
		if f.Status != 200 || len(seen) != 1 || seen[0].Header.Get("Authorization") != "Bearer "+tok {
			t.Fatalf("after the restart: %s", detail)
		}
	})
	t.Run("a restarted server loses nothing, and keeps no secret in clear", func(t *testing.T) {
		s.stop(syscall.SIGKILL)
		s.start()
		s.waitState(id, "Running")
		seen, f, detail := injected("fetch", "https://provider.test/bearer/after-restart")
		if f.Status != 200 || len(seen) != 1 || seen[0].Header.Get("Authorization") != "Bearer "+tok {
			t.Fatalf("after the server restarted: %s", detail)
		}
		upper := strings.TrimSpace(docker(t, "inspect", "-f", "{{.GraphDriver.Data.UpperDir}}", "osb-"+id+"-egress"))
		for _, dir := range []string{s.dataDir, upper} {
			if found := scanTree(dir, secrets); len(found) > 0 {
				t.Errorf("a secret in clear under %s: %v", dir, found)
			}
		}
	})

	t.Run("the contract's errors", func(t *testing.T) {
		cur := func() int64 {
			var st api.CredentialVaultState
			code, body := eg.do("GET", "/credential-vault", "")
			if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
				t.Fatalf("GET /credential-vault: %d %s", code, body)
			}
			return st.Revision
		}
		if code, body := eg.do("POST", "/credential-vault", vault); code != 409 {
			t.Errorf("a second POST: %d %s", code, body)
		}
		rev := cur()
		if code, body := eg.do("PATCH", "/credential-vault", fmt.Sprintf(`{"expectedRevision":%d,"credentials":{"delete":["two"]},"bindings":{"delete":["custom"]}}`, rev+5)); code != 409 {
			t.Errorf("a stale revision: %d %s", code, body)
		}
		bad := map[string]string{
			"an address as host":        `{"name":"b","match":{"hosts":["203.0.113.5"]},"auth":{"type":"bearer","credential":"tok"}}`,
			"a host the policy denies":  `{"name":"b","match":{"hosts":["other.test"]},"auth":{"type":"bearer","credential":"tok"}}`,
			"the http scheme":           `{"name":"b","match":{"hosts":["hostile.test"],"schemes":["http"]},"auth":{"type":"bearer","credential":"tok"}}`,
			"a port not intercepted":    `{"name":"b","match":{"hosts":["hostile.test"],"ports":[8443]},"auth":{"type":"bearer","credential":"tok"}}`,
			"a forbidden header":        `{"name":"b","match":{"hosts":["hostile.test"]},"auth":{"type":"apiKey","name":"Host","credential":"tok"}}`,
			"an unknown credential":     `{"name":"b","match":{"hosts":["hostile.test"]},"auth":{"type":"bearer","credential":"nope"}}`,
			"a binding that overlaps":   `{"name":"b","match":{"hosts":["provider.test"],"paths":["/bearer/x"]},"auth":{"type":"bearer","credential":"tok"}}`,
			"an unknown field":          `{"name":"b","match":{"hosts":["hostile.test"]},"auth":{"type":"bearer","credential":"tok"},"extra":1}`,
			"a path without a slash":    `{"name":"b","match":{"hosts":["hostile.test"],"paths":["v1"]},"auth":{"type":"bearer","credential":"tok"}}`,
			"an auth type not known":    `{"name":"b","match":{"hosts":["hostile.test"]},"auth":{"type":"oauth","credential":"tok"}}`,
			"a name already bound":      `{"name":"bearer","match":{"hosts":["hostile.test"]},"auth":{"type":"bearer","credential":"tok"}}`,
			"customHeaders with none":   `{"name":"b","match":{"hosts":["hostile.test"]},"auth":{"type":"customHeaders","headers":[]}}`,
			"a wildcard of an IP range": `{"name":"b","match":{"hosts":["*.203.0.113"]},"auth":{"type":"bearer","credential":"tok"}}`,
		}
		for name, b := range bad {
			if code, body := eg.do("PATCH", "/credential-vault", `{"bindings":{"add":[`+b+`]}}`); code != 400 {
				t.Errorf("%s: %d %s", name, code, body)
			}
		}
		if got := cur(); got != rev {
			t.Errorf("revision %d after refused changes, want %d", got, rev)
		}
		if code, body := eg.do("PATCH", "/credential-vault", fmt.Sprintf(`{"expectedRevision":%d,"credentials":{"replace":[{"name":"two","source":{"value":"rotated"}}]}}`, rev)); code != 200 {
			t.Errorf("a PATCH at the current revision: %d %s", code, body)
		}
		if code, _ := eg.do("GET", "/credential-vault", "", "wrong"); code != 401 {
			t.Errorf("a wrong token: %d", code)
		}
		if code, body := s.egress(noProxy).do("POST", "/credential-vault", vault); code != 412 {
			t.Errorf("a sandbox without credentialProxy: %d %s", code, body)
		}
		if code, body := plainWriteFromElsewhere(t, n.sn, "osb-"+id+"-egress", eg.token, vault); code != 426 {
			t.Errorf("a write over plain HTTP from another address of the network: %d %s", code, body)
		}
	})

	t.Run("delete takes the vault with the egress container", func(t *testing.T) {
		s.call("DELETE", "/v1/sandboxes/"+id, nil, 204, nil)
		s.waitGone(id)
		testwait.Until(t, "the egress container to go", func() bool {
			return exec.Command("docker", "inspect", "osb-"+id+"-egress").Run() != nil
		}, nil)
	})
}

// vaultDenials are osb-egress's recent refusals of kind "vault".
func vaultDenials(t *testing.T, eg *egressAPI) []struct{ Name, Reason string } {
	t.Helper()
	code, body := eg.do("GET", "/denials", "")
	if code != 200 {
		t.Fatalf("GET /denials: %d %s", code, body)
	}
	var all []struct{ Kind, Name, Reason string }
	if err := json.Unmarshal([]byte(body), &all); err != nil {
		t.Fatal(err)
	}
	var out []struct{ Name, Reason string }
	for _, d := range all {
		if d.Kind == "vault" {
			out = append(out, struct{ Name, Reason string }{d.Name, d.Reason})
		}
	}
	return out
}

// plainWriteFromElsewhere sends a vault write to the egress container's
// own address over plain HTTP from the test's internet namespace: a peer
// that is neither loopback nor the network's gateway (a connection from
// this host would be translated to the gateway's address). The engine
// forwards it because the egress API's port is published.
func plainWriteFromElsewhere(t *testing.T, sn *standin.Net, egressName, token, body string) (int, string) {
	t.Helper()
	ip := strings.TrimSpace(docker(t, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", egressName))
	client := &http.Client{Transport: &http.Transport{DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
		return sn.Dial(network, addr)
	}}, Timeout: 20 * time.Second}
	req, _ := http.NewRequest("POST", "http://"+net.JoinHostPort(ip, "18080")+"/credential-vault", strings.NewReader(body))
	req.Header.Set(api.HeaderEgressAuth, token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("write from the test's internet: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scanContainer looks, from the host, for any of needles in the files of
// container name's root file system and in the environment, command line
// and readable memory of each of its processes.
func scanContainer(t *testing.T, name string, needles []string) []string {
	t.Helper()
	pid := strings.TrimSpace(docker(t, "inspect", "-f", "{{.State.Pid}}", name))
	// The trailing slash: WalkDir does not follow the root when it is a
	// link, and /proc/PID/root is one.
	found := scanTree("/proc/"+pid+"/root/", needles)
	for _, p := range containerPIDs(t, name) {
		for _, f := range []string{"environ", "cmdline"} {
			if data, err := os.ReadFile("/proc/" + p + "/" + f); err == nil {
				for _, n := range needles {
					if bytes.Contains(data, []byte(n)) {
						found = append(found, "/proc/"+p+"/"+f)
					}
				}
			}
		}
		found = append(found, scanMemory(p, needles)...)
	}
	return found
}

// containerPIDs are the host PIDs of container name's processes.
func containerPIDs(t *testing.T, name string) []string {
	t.Helper()
	out := docker(t, "top", name, "-eo", "pid")
	var pids []string
	for _, f := range strings.Fields(out) {
		if _, err := strconv.Atoi(f); err == nil {
			pids = append(pids, f)
		}
	}
	return pids
}

// scanTree looks for needles in the regular files under root (not /proc,
// /sys or /dev of a root file system).
func scanTree(root string, needles []string) []string {
	var found []string
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(path, root), "/")
		if d.IsDir() && (rel == "/proc" || rel == "/sys" || rel == "/dev") {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err != nil || info.Size() > 64<<20 {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		for _, n := range needles {
			if bytes.Contains(data, []byte(n)) {
				found = append(found, path)
			}
		}
		return nil
	})
	return found
}

// scanMemory looks for needles in the readable private mappings of
// process pid.
func scanMemory(pid string, needles []string) []string {
	maps, err := os.ReadFile("/proc/" + pid + "/maps")
	if err != nil {
		return nil
	}
	mem, err := os.Open("/proc/" + pid + "/mem")
	if err != nil {
		return nil
	}
	defer mem.Close()
	var found []string
	for line := range strings.Lines(string(maps)) {
		f := strings.Fields(line)
		if len(f) < 2 || f[1][0] != 'r' {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end-start > 256<<20 {
			continue
		}
		buf := make([]byte, end-start)
		if _, err := mem.ReadAt(buf, int64(start)); err != nil {
			continue
		}
		for _, n := range needles {
			if bytes.Contains(buf, []byte(n)) {
				found = append(found, fmt.Sprintf("/proc/%s/mem %s", pid, f[0]))
			}
		}
	}
	return found
}
