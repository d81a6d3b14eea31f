package mitm

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/egress"
)

// echoHeaders answers with the request's method, path and the headers
// the tests look at.
func echoHeaders(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "%s %s proto=%d\n", r.Method, r.URL.RequestURI(), r.ProtoMajor)
}

// get sends a GET for path to the provider through c with extra headers.
func get(t *testing.T, c *http.Client, path string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", "https://"+providerName+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	return do(t, c, req)
}

func do(t *testing.T, c *http.Client, req *http.Request) (*http.Response, string) {
	t.Helper()
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.Method, req.URL, err)
	}
	return res, string(body)
}

func TestInjectAuthForms(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), false, echoHeaders)
	cases := []struct {
		name    string
		headers []egress.InjectedHeader
	}{
		{"bearer", []egress.InjectedHeader{{Name: "Authorization", Value: "Bearer " + secretKey}}},
		{"basic", []egress.InjectedHeader{{Name: "Authorization", Value: "Basic " + secretUser}}},
		{"apiKey", []egress.InjectedHeader{{Name: "X-Api-Key", Value: secretKey}}},
		{"customHeaders", []egress.InjectedHeader{
			{Name: "X-Api-Key", Value: secretKey},
			{Name: "X-Account", Value: secretUser},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := &testBinder{
				rules:   []rule{{name: tc.name, host: providerName, prefix: "/v1/", headers: tc.headers}},
				secrets: []string{secretKey, secretUser},
			}
			h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()}, withBinder(b))
			before := len(up.seen())
			// The sandbox sends its own (fake) values under the same
			// names, in another case: they must not reach the server.
			hdr := http.Header{"X-Other": {"kept"}}
			for _, ih := range tc.headers {
				hdr[strings.ToLower(ih.Name)] = []string{"sandbox-fake"}
			}
			res, body := get(t, h.client(t, false), "/v1/models?limit=2", hdr)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d, body %q", res.StatusCode, body)
			}
			reqs := up.seen()[before:]
			if len(reqs) != 1 {
				t.Fatalf("upstream saw %d requests, want 1", len(reqs))
			}
			got := reqs[0]
			for _, ih := range tc.headers {
				if v := got.Header.Values(ih.Name); len(v) != 1 || v[0] != ih.Value {
					t.Errorf("upstream %s = %q, want [%q]", ih.Name, v, ih.Value)
				}
			}
			for k, v := range got.Header {
				if slicesContain(v, "sandbox-fake") {
					t.Errorf("upstream got the sandbox's %s", k)
				}
			}
			if v := got.Header.Get("X-Other"); v != "kept" {
				t.Errorf("upstream X-Other = %q, want kept", v)
			}
			if got.URL.RequestURI() != "/v1/models?limit=2" {
				t.Errorf("upstream request URI %q", got.URL.RequestURI())
			}
			if got.Host != providerName {
				t.Errorf("upstream Host %q", got.Host)
			}
			for _, k := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"} {
				if v, ok := got.Header[k]; ok {
					t.Errorf("upstream got %s: %q", k, v)
				}
			}
			if st := h.ic.Stats(); st.Injected != 1 || st.Requests != 1 {
				t.Errorf("stats %+v, want 1 request injected", st)
			}
			if ev := h.eventList(); len(ev) != 0 {
				t.Errorf("events %+v, want none", ev)
			}
		})
	}
}

func slicesContain(vs []string, s string) bool {
	for _, v := range vs {
		if v == s {
			return true
		}
	}
	return false
}

// The path the binding judged is the path sent: a binding normalises
// /v1/./x to /v1/x and the server sees /v1/x.
func TestInjectSendsJudgedPath(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), false, echoHeaders)
	b := bearerBinder()
	b.rules[0].path = "/v1/chat%2Fcompletions"
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()}, withBinder(b))
	req, _ := http.NewRequest("GET", "https://"+providerName+"/v1/./chat/completions?x=1", nil)
	res, _ := do(t, h.client(t, false), req)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	got := up.seen()[0]
	if got.URL.RequestURI() != "/v1/chat%2Fcompletions?x=1" {
		t.Errorf("upstream saw %q, want /v1/chat%%2Fcompletions?x=1", got.URL.RequestURI())
	}
}

// TestForwardedHeaders: a request without a credential keeps the
// client's forwarding headers as sent; one with a credential loses every
// header that could steer the server to another host, path or method
// than the one judged, and carries the canonical Host.
func TestForwardedHeaders(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), false, echoHeaders)
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()})
	steer := http.Header{
		"X-Forwarded-For": {"10.0.0.1"}, "X-Forwarded-Host": {"other.test"}, "Forwarded": {"host=other.test"},
		"X-Http-Method-Override": {"DELETE"}, "X-Original-Url": {"/admin"}, "X-Rewrite-Url": {"/admin"},
	}
	get(t, h.client(t, false), "/public", steer)
	got := up.seen()[0]
	if v := got.Header.Values("X-Forwarded-For"); len(v) != 1 || v[0] != "10.0.0.1" {
		t.Errorf("without a credential: X-Forwarded-For = %q, want the client's [10.0.0.1] only", v)
	}
	get(t, h.client(t, false), "/v1/x", steer)
	got = up.seen()[1]
	if got.Header.Get("Authorization") == "" {
		t.Fatal("the credential was not injected")
	}
	for k := range steer {
		if v := got.Header.Values(k); len(v) > 0 {
			t.Errorf("with a credential: %s = %q went upstream", k, v)
		}
	}
	if got.Host != providerName {
		t.Errorf("upstream Host %q, want %q", got.Host, providerName)
	}
}

func TestHostMustMatchSNI(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName, otherName), false, echoHeaders)
	h := newHarness(t, uca.pool, map[string]string{
		providerName: up.Listener.Addr().String(),
		otherName:    up.Listener.Addr().String(),
	})
	c := h.client(t, false)
	cases := []struct {
		host string
		want int
	}{
		{otherName, http.StatusMisdirectedRequest},
		{providerName + ":8443", http.StatusMisdirectedRequest},
		{providerName + ":x", http.StatusMisdirectedRequest},
		{"", http.StatusMisdirectedRequest},
		{"API.Provider.TEST.", http.StatusOK},
		{providerName + ":443", http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.host, func(t *testing.T) {
			before, evBefore := len(up.seen()), len(h.eventList())
			req, _ := http.NewRequest("GET", "https://"+providerName+"/v1/x", nil)
			req.Host = tc.host
			if tc.host == "" {
				// An HTTP/1.0 request without Host, written by hand.
				res := rawHTTP1(t, h, "GET /v1/x HTTP/1.0\r\n\r\n")
				if res.StatusCode != tc.want {
					t.Fatalf("status %d, want %d", res.StatusCode, tc.want)
				}
			} else {
				res, body := do(t, c, req)
				if res.StatusCode != tc.want {
					t.Fatalf("status %d, want %d (%q)", res.StatusCode, tc.want, body)
				}
				if strings.Contains(body, secretKey) {
					t.Errorf("answer holds the secret: %q", body)
				}
			}
			seen := up.seen()[before:]
			if tc.want != http.StatusOK {
				if len(seen) != 0 {
					t.Errorf("upstream saw %d requests, want none", len(seen))
				}
				ev := h.eventList()[evBefore:]
				if len(ev) != 1 || ev[0].Kind != EventKind || ev[0].Name != providerName || ev[0].Port != 443 {
					t.Errorf("events %+v, want one vault event for %s:443", ev, providerName)
				}
				return
			}
			if len(seen) != 1 || seen[0].Header.Get("Authorization") != "Bearer "+secretKey {
				t.Errorf("upstream saw %d requests, want 1 with the key", len(seen))
			}
		})
	}
}

// rawHTTP1 writes a request by hand over a TLS connection that
// negotiates http/1.1, and reads the answer.
func rawHTTP1(t *testing.T, h *harness, request string) *http.Response {
	t.Helper()
	c, err := tls.Dial("tcp", h.front.Addr().String(), &tls.Config{
		ServerName: providerName, RootCAs: h.caPool(), NextProtos: []string{"http/1.1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitFor))
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}

// Each request of a keep-alive connection is judged on its own: a
// misdirected one between two good ones changes nothing for them.
func TestRequestsJudgedOneByOne(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), false, echoHeaders)
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()})
	for _, h2 := range []bool{false, true} {
		c := h.client(t, h2)
		for i, host := range []string{providerName, otherName, providerName} {
			req, _ := http.NewRequest("GET", "https://"+providerName+"/v1/x", nil)
			req.Host = host
			res, _ := do(t, c, req)
			want := http.StatusOK
			if host == otherName {
				want = http.StatusMisdirectedRequest
			}
			if res.StatusCode != want {
				t.Errorf("h2=%v request %d to %s: status %d, want %d", h2, i, host, res.StatusCode, want)
			}
		}
	}
	if st := h.ic.Stats(); st.Connections != 2 || st.Requests != 6 || st.Injected != 4 || st.Refused != 2 {
		t.Errorf("stats %+v, want 2 connections, 6 requests, 4 injected, 2 refused", st)
	}
}

func TestAmbiguousRefused(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), false, echoHeaders)
	b := bearerBinder()
	b.rules = append(b.rules, rule{name: "second", host: providerName, prefix: "/v1/chat",
		headers: []egress.InjectedHeader{{Name: "X-Api-Key", Value: secretKey}}})
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()}, withBinder(b))
	res, body := get(t, h.client(t, false), "/v1/chat", nil)
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("status %d, want 403", res.StatusCode)
	}
	if strings.Contains(body, secretKey) || strings.Contains(body, "second") {
		t.Errorf("answer says too much: %q", body)
	}
	if n := len(up.seen()); n != 0 {
		t.Errorf("upstream saw %d requests, want none", n)
	}
	ev := h.eventList()
	if len(ev) != 1 || !strings.Contains(ev[0].Reason, "more than one") {
		t.Errorf("events %+v, want one about ambiguity", ev)
	}
}

func TestNoBindingForwardedUnchanged(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "identity")
		io.WriteString(w, `{"ok":true}`)
	})
	for _, tc := range []struct {
		name   string
		binder egress.Binder
		reason string
	}{
		{"no-match", bearerBinder(), "not injected: GET " + providerName + " /public"},
		{"no-vault", nil, "not injected: no vault"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()}, withBinder(tc.binder))
			if tc.binder == nil {
				h.ic.cfg.Binder = func() egress.Binder { return nil }
			}
			before := len(up.seen())
			res, body := get(t, h.client(t, false), "/public", http.Header{"Authorization": {"Bearer mine"}, "Accept-Encoding": {"gzip"}})
			if res.StatusCode != http.StatusOK || body != `{"ok":true}` {
				t.Fatalf("status %d body %q", res.StatusCode, body)
			}
			got := up.seen()[before]
			if v := got.Header.Get("Authorization"); v != "Bearer mine" {
				t.Errorf("upstream Authorization %q, want the client's", v)
			}
			// With a vault every body is searched, so it is asked for
			// unencoded; without one the request goes as sent.
			want := "gzip"
			if tc.binder != nil {
				want = "identity"
			}
			if v := got.Header.Get("Accept-Encoding"); v != want {
				t.Errorf("upstream Accept-Encoding %q, want %q", v, want)
			}
			ev := h.eventList()
			if len(ev) != 1 || !strings.HasPrefix(ev[0].Reason, tc.reason) || ev[0].Kind != EventKind {
				t.Errorf("events %+v, want one %q", ev, tc.reason)
			}
			if st := h.ic.Stats(); st.NotInjected != 1 || st.Injected != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// splitWriter writes s in pieces, flushing after each, so the secret
// crosses reads on the interceptor's side.
func splitWriter(w http.ResponseWriter, s string, cuts ...int) {
	f := w.(http.Flusher)
	prev := 0
	for _, c := range append(cuts, len(s)) {
		io.WriteString(w, s[prev:c])
		f.Flush()
		time.Sleep(5 * time.Millisecond)
		prev = c
	}
}

func TestRedaction(t *testing.T) {
	uca := newUpstreamCA(t)
	jsonBody := `{"echo":"Bearer ` + secretKey + `","again":"` + secretKey + `"}`
	cut := strings.Index(jsonBody, secretKey) + 7 // inside the first secret
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, secretKey)
	zw.Close()
	up := startUpstream(t, uca.leaf(t, providerName), false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Echo", "key="+secretKey)
		w.Header().Set("X-Accept-Encoding", r.Header.Get("Accept-Encoding"))
		switch r.URL.Path {
		case "/v1/json", "/public/json":
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.Header().Set("Content-Length", fmt.Sprint(len(jsonBody)))
			splitWriter(w, jsonBody, cut, cut+3)
		case "/v1/problem":
			w.Header().Set("Content-Type", "application/problem+json")
			io.WriteString(w, secretKey)
		case "/v1/binary":
			w.Header().Set("Content-Type", "application/octet-stream")
			io.WriteString(w, secretKey)
		case "/v1/gzip":
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(gz.Bytes())
		case "/v1/trailer":
			w.Header().Set("Trailer", "X-Checksum")
			w.Header().Set("Content-Type", "application/octet-stream")
			io.WriteString(w, "data")
			w.Header().Set("X-Checksum", secretKey)
		case "/v1/head":
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Content-Length", "5")
		}
	})
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()})
	c := h.client(t, false)
	cases := []struct {
		path, method, want string
		acceptEncoding     string // what upstream was asked for
	}{
		{"/v1/json", "GET", strings.ReplaceAll(jsonBody, secretKey, Redacted), "identity"},
		{"/v1/problem", "GET", Redacted, "identity"},
		{"/v1/binary", "GET", secretKey, "identity"},
		{"/v1/gzip", "GET", gz.String(), "identity"},
		{"/v1/trailer", "GET", "data", "identity"},
		{"/v1/head", "HEAD", "", "identity"},
		// Not injected: the body is searched too (a credential stored
		// through a binding could be read back here).
		{"/public/json", "GET", strings.ReplaceAll(jsonBody, secretKey, Redacted), "identity"},
	}
	for _, tc := range cases {
		t.Run(strings.TrimPrefix(tc.path, "/"), func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, "https://"+providerName+tc.path, nil)
			req.Header.Set("Accept-Encoding", "gzip")
			res, body := do(t, c, req)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d", res.StatusCode)
			}
			if body != tc.want {
				t.Errorf("body %q, want %q", body, tc.want)
			}
			if v := res.Header.Get("X-Echo"); v != "key="+Redacted {
				t.Errorf("X-Echo %q, want key=%s", v, Redacted)
			}
			if v := res.Header.Get("X-Accept-Encoding"); v != tc.acceptEncoding {
				t.Errorf("upstream was asked for %q, want %q", v, tc.acceptEncoding)
			}
			if v := res.Trailer.Get("X-Checksum"); strings.Contains(v, secretKey) {
				t.Errorf("trailer X-Checksum %q holds the secret", v)
			}
			if tc.path == "/v1/trailer" && res.Trailer.Get("X-Checksum") != Redacted {
				t.Errorf("trailer X-Checksum %q, want %s", res.Trailer.Get("X-Checksum"), Redacted)
			}
			if tc.method == "HEAD" && res.ContentLength != 5 {
				t.Errorf("HEAD Content-Length %d, want 5", res.ContentLength)
			}
		})
	}
}

// Informational responses (103 Early Hints) pass on with their headers
// redacted.
func TestRedactInterimHeaders(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css?k="+secretKey+">; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		io.WriteString(w, "ok")
	})
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()})
	var mu sync.Mutex
	var hints []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, hdr textproto.MIMEHeader) error {
		mu.Lock()
		defer mu.Unlock()
		hints = append(hints, fmt.Sprintf("%d %s", code, hdr.Get("Link")))
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "https://"+providerName+"/v1/page", nil)
	res, body := do(t, h.client(t, false), req)
	if res.StatusCode != http.StatusOK || body != "ok" {
		t.Fatalf("status %d body %q", res.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := "103 </style.css?k=" + Redacted + ">; rel=preload"; len(hints) != 1 || hints[0] != want {
		t.Errorf("interim responses %q, want [%q]", hints, want)
	}
}

func TestRedactBodyLimit(t *testing.T) {
	uca := newUpstreamCA(t)
	body := secretKey + strings.Repeat(".", 100) + secretKey
	up := startUpstream(t, uca.leaf(t, providerName), false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Accept-Encoding", r.Header.Get("Accept-Encoding"))
		io.WriteString(w, body)
	})
	for _, tc := range []struct {
		limit int64
		want  string
		ae    string
	}{
		{50, Redacted + strings.Repeat(".", 100) + secretKey, "identity"},
		{-1, body, ""},
	} {
		t.Run(fmt.Sprint(tc.limit), func(t *testing.T) {
			h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()}, withRedactBytes(tc.limit))
			res, got := get(t, h.client(t, false), "/v1/x", nil)
			if got != tc.want {
				t.Errorf("body %q, want %q", got, tc.want)
			}
			if v := res.Header.Get("X-Accept-Encoding"); v != tc.ae {
				t.Errorf("upstream asked for %q, want %q", v, tc.ae)
			}
		})
	}
}

// Server-sent events reach the client one by one: the first arrives
// before the server writes the second.
func TestEventStreamNotBuffered(t *testing.T) {
	uca := newUpstreamCA(t)
	second := make(chan struct{})
	up := startUpstream(t, uca.leaf(t, providerName), true, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "data: one "+secretKey+"\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-second:
		case <-time.After(waitFor):
			return
		}
		io.WriteString(w, "data: two\n\n")
	})
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()})
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			second = make(chan struct{})
			req, _ := http.NewRequest("GET", "https://"+providerName+"/v1/stream", nil)
			res, err := h.client(t, h2).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			br := bufio.NewReader(res.Body)
			done := make(chan string, 1)
			go func() {
				var ev strings.Builder
				for {
					line, err := br.ReadString('\n')
					ev.WriteString(line)
					if err != nil || line == "\n" {
						done <- ev.String()
						return
					}
				}
			}()
			select {
			case ev := <-done:
				if want := "data: one " + Redacted + "\n\n"; ev != want {
					t.Fatalf("first event %q, want %q", ev, want)
				}
			case <-time.After(10 * time.Second):
				close(second)
				t.Fatal("the first event did not arrive before the second was sent")
			}
			close(second)
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "data: two\n\n" {
				t.Errorf("rest %q, %v", rest, err)
			}
		})
	}
}

func TestHTTP2(t *testing.T) {
	uca := newUpstreamCA(t)
	for _, tc := range []struct {
		name                 string
		clientH2, upstreamH2 bool
	}{
		{"h2-client-h1-upstream", true, false},
		{"h1-client-h2-upstream", false, true},
		{"h2-both", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startUpstream(t, uca.leaf(t, providerName), tc.upstreamH2, echoHeaders)
			h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()})
			res, body := get(t, h.client(t, tc.clientH2), "/v1/models", nil)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d", res.StatusCode)
			}
			if want := map[bool]int{false: 1, true: 2}[tc.clientH2]; res.ProtoMajor != want {
				t.Errorf("client spoke HTTP/%d, want %d", res.ProtoMajor, want)
			}
			wantUp := map[bool]int{false: 1, true: 2}[tc.upstreamH2]
			if !strings.Contains(body, fmt.Sprintf("proto=%d", wantUp)) {
				t.Errorf("upstream answered %q, want proto=%d", body, wantUp)
			}
			got := up.seen()
			if len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+secretKey {
				t.Errorf("upstream did not see the key")
			}
		})
	}
}

// wsAccept is the Sec-WebSocket-Accept for key (RFC 6455 §4.2.2).
func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(h[:])
}

// An upgrade goes through on HTTP/1.1 even to an upstream that speaks
// h2, carries the credential, and then echoes bytes both ways.
func TestWebSocketUpgrade(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), true, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" || r.ProtoMajor != 1 {
			http.Error(w, "want a websocket upgrade over HTTP/1.1", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\nX-Echo: %s\r\n\r\n",
			wsAccept(r.Header.Get("Sec-WebSocket-Key")), secretKey)
		brw.Flush()
		io.Copy(conn, brw) // echo
	})
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()})

	// Warm the pool with an h2 connection the upgrade must not use.
	get(t, h.client(t, false), "/v1/warm", nil)

	c, err := tls.Dial("tcp", h.front.Addr().String(), &tls.Config{
		ServerName: providerName, RootCAs: h.caPool(), NextProtos: []string{"http/1.1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitFor))
	const key = "dGhlIHNhbXBsZSBub25jZQ=="
	fmt.Fprintf(c, "GET /v1/realtime HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", providerName, key)
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get("Sec-WebSocket-Accept") != wsAccept(key) {
		t.Fatalf("status %d, accept %q", res.StatusCode, res.Header.Get("Sec-WebSocket-Accept"))
	}
	if v := res.Header.Get("X-Echo"); v != Redacted {
		t.Errorf("101 X-Echo %q, want %s", v, Redacted)
	}
	for _, msg := range []string{"\x81\x05hello", "\x81\x05again"} {
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
			t.Fatalf("echo %q, %v; want %q", got, err, msg)
		}
	}
	seen := up.seen()
	last := seen[len(seen)-1]
	if last.URL.Path != "/v1/realtime" || last.Header.Get("Authorization") != "Bearer "+secretKey {
		t.Errorf("upstream upgrade request %s without the key", last.URL.Path)
	}
}

// An upstream whose certificate the roots do not vouch for gets no
// request at all, so never the secret, and the client a bare 502.
func TestUntrustedUpstream(t *testing.T) {
	trusted, rogue := newUpstreamCA(t), newUpstreamCA(t)
	var mu sync.Mutex
	var handled int
	srv := startUpstream(t, rogue.leaf(t, providerName), false, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		handled++
		mu.Unlock()
	})
	// The raw bytes the rogue server reads, to be sure the key never
	// crossed the wire even in a handshake that failed.
	var wire bytes.Buffer
	var wireMu sync.Mutex
	h := newHarness(t, trusted.pool, map[string]string{providerName: srv.Listener.Addr().String()})
	h.ic.tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := h.ic.dialUpstream(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &recordConn{Conn: c, mu: &wireMu, w: &wire}, nil
	}
	res, body := get(t, h.client(t, false), "/v1/models", nil)
	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", res.StatusCode)
	}
	if res.Header.Get("Content-Type") != "text/plain; charset=utf-8" || strings.Contains(body, "x509") || strings.Contains(body, "certificate") {
		t.Errorf("502 says too much: %q", body)
	}
	mu.Lock()
	defer mu.Unlock()
	if handled != 0 {
		t.Errorf("the untrusted upstream handled %d requests", handled)
	}
	wireMu.Lock()
	defer wireMu.Unlock()
	if bytes.Contains(wire.Bytes(), []byte(secretKey)) {
		t.Error("the secret went to the untrusted upstream")
	}
	ev := h.eventList()
	if len(ev) != 1 || ev[0].Reason != "upstream certificate not trusted" {
		t.Errorf("events %+v, want one about the certificate", ev)
	}
	if st := h.ic.Stats(); st.UpstreamErrors != 1 {
		t.Errorf("stats %+v", st)
	}
}

// recordConn copies what is written to it into w.
type recordConn struct {
	net.Conn
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.w.Write(p)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func TestUnreachableUpstream(t *testing.T) {
	uca := newUpstreamCA(t)
	h := newHarness(t, uca.pool, map[string]string{}) // no route
	res, body := get(t, h.client(t, false), "/v1/models", nil)
	if res.StatusCode != http.StatusBadGateway || strings.Contains(body, "route") {
		t.Fatalf("status %d body %q, want a bare 502", res.StatusCode, body)
	}
	if d := h.dialedList(); len(d) != 1 || d[0] != providerName+":443" {
		t.Errorf("dialed %q, want [%s:443]", d, providerName)
	}
}

// A client whose SNI is not the name the proxy checked gets no
// certificate.
func TestClientSNIMustMatch(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), false, echoHeaders)
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()})
	_, err := tls.Dial("tcp", h.front.Addr().String(), &tls.Config{ServerName: otherName, RootCAs: h.caPool()})
	if err == nil {
		t.Fatal("handshake for another name succeeded")
	}
	ev := h.eventList()
	if len(ev) != 1 || ev[0].Name != providerName || !strings.Contains(ev[0].Reason, "TLS server name") {
		t.Errorf("events %+v", ev)
	}
	// Case and a trailing dot do not matter.
	c, err := tls.Dial("tcp", h.front.Addr().String(), &tls.Config{ServerName: "API.provider.test", RootCAs: h.caPool()})
	if err != nil {
		t.Fatalf("handshake in upper case: %v", err)
	}
	c.Close()
}

func TestServeHTTP1Plain(t *testing.T) {
	var seen http.Header
	var mu sync.Mutex
	srv := httptestServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = r.Header.Clone()
		mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "echo "+r.Header.Get("Authorization"))
	})
	h := newHarness(t, nil, map[string]string{providerName: srv})
	h.mu.Lock()
	h.plain = true
	h.mu.Unlock()
	b := bearerBinder()
	h.ic.cfg.Binder = func() egress.Binder { return b }
	c, err := net.Dial("tcp", h.front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitFor))
	br := bufio.NewReader(c)
	for _, host := range []string{providerName, otherName} {
		fmt.Fprintf(c, "GET /v1/x HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		switch host {
		case providerName:
			if res.StatusCode != http.StatusOK || string(body) != "echo Bearer "+Redacted {
				t.Errorf("status %d body %q", res.StatusCode, body)
			}
			mu.Lock()
			if seen.Get("Authorization") != "Bearer "+secretKey {
				t.Errorf("upstream Authorization %q", seen.Get("Authorization"))
			}
			mu.Unlock()
		case otherName:
			if res.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("Host %s: status %d, want 421", host, res.StatusCode)
			}
		}
	}
	if d := h.dialedList(); len(d) != 1 || d[0] != providerName+":80" {
		t.Errorf("dialed %q", d)
	}
}

// httptestServer starts a plain HTTP server and returns its address.
func httptestServer(t *testing.T, f http.HandlerFunc) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: f}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

func TestConcurrentRequests(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), true, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"auth":%q,"path":%q}`, r.Header.Get("Authorization"), r.URL.Path)
	})
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()})
	clients := []*http.Client{h.client(t, false), h.client(t, true)}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for g := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[g%2]
			for i := range 10 {
				path := fmt.Sprintf("/v1/g%d/%d", g, i)
				want := fmt.Sprintf(`{"auth":"Bearer %s","path":%q}`, Redacted, path)
				if i%3 == 0 {
					path = fmt.Sprintf("/public/g%d/%d", g, i)
					want = fmt.Sprintf(`{"auth":"","path":%q}`, path)
				}
				res, err := c.Get("https://" + providerName + path)
				if err != nil {
					errs <- err
					return
				}
				body, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil || string(body) != want {
					errs <- fmt.Errorf("%s: body %q, %v; want %q", path, body, err, want)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := h.ic.Stats(); st.Requests != 200 || st.Injected+st.NotInjected != 200 {
		t.Errorf("stats %+v", st)
	}
}

func TestCloseEndsServing(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), false, echoHeaders)
	h := newHarness(t, uca.pool, map[string]string{providerName: up.Listener.Addr().String()})
	c := h.client(t, false)
	get(t, c, "/v1/x", nil) // leaves an idle keep-alive connection
	done := make(chan struct{})
	go func() {
		h.ic.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("Close did not return")
	}
	// A connection handed over after Close is closed at once.
	a, b := net.Pipe()
	defer b.Close()
	served := make(chan struct{})
	go func() {
		h.ic.ServeTLS(a, nil, providerName, dst)
		close(served)
	}()
	select {
	case <-served:
	case <-time.After(waitFor):
		t.Fatal("ServeTLS after Close did not return")
	}
}

func TestNewValidates(t *testing.T) {
	ca, err := NewCA(time.Now(), time.Hour, "x")
	if err != nil {
		t.Fatal(err)
	}
	binder := func() egress.Binder { return nil }
	dial := func(context.Context, string, uint16) (net.Conn, error) { return nil, nil }
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no CA", Config{Binder: binder, Dial: dial}, "CA"},
		{"no Binder", Config{CA: ca, Dial: dial}, "Binder"},
		{"no Dial", Config{CA: ca, Binder: binder}, "Dial"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// The upstream's certificate must name the name dialed: one valid for
// another name gets no request.
func TestUpstreamWrongName(t *testing.T) {
	uca := newUpstreamCA(t)
	up := startUpstream(t, uca.leaf(t, providerName), false, echoHeaders)
	b := &testBinder{
		rules: []rule{{name: "other", host: otherName, prefix: "/",
			headers: []egress.InjectedHeader{{Name: "Authorization", Value: "Bearer " + secretKey}}}},
		secrets: []string{secretKey},
	}
	h := newHarness(t, uca.pool, map[string]string{otherName: up.Listener.Addr().String()}, withBinder(b))
	h.mu.Lock()
	h.sni = otherName
	h.mu.Unlock()
	req, _ := http.NewRequest("GET", "https://"+otherName+"/x", nil)
	res, _ := do(t, h.client(t, false), req)
	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", res.StatusCode)
	}
	if n := len(up.seen()); n != 0 {
		t.Errorf("upstream saw %d requests", n)
	}
	if ev := h.eventList(); len(ev) != 1 || ev[0].Reason != "upstream certificate not trusted" {
		t.Errorf("events %+v", ev)
	}
}
