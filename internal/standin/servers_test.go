package standin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestServers reaches each kind of server from the host: TLS with any SNI
// under the test CA (and ECH), DoH and DoT from the same changing
// records, a server that speaks first, UDP echo; and a server nobody
// dialed counts no hits.
func TestServers(t *testing.T) {
	doc := netip.MustParsePrefix("203.0.113.0/24")
	n := New(t, Pick(t, netip.MustParsePrefix("198.51.100.0/24"), 1), netip.Addr{})
	web, ns, untouched := Pick(t, doc, 7), Pick(t, doc, 53), Pick(t, doc, 9)
	for _, a := range []netip.Addr{web, ns, untouched} {
		n.Add(a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	tlsSrv := n.ServeTLS(netip.AddrPortFrom(web, 443), "secret page")
	idle := n.ServeTLS(netip.AddrPortFrom(untouched, 443), "never read")
	get := func(sni, host string, ech []byte) (*http.Response, string) {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: n.CA(), ServerName: sni, EncryptedClientHelloConfigList: ech}}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, "GET", tlsSrv.URL+"path", nil)
		req.Host = host
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("GET %s with SNI %q: %v", tlsSrv.URL, sni, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	resp, body := get("web.test", "other.test", nil)
	if body != "secret page" || resp.Header.Get("X-Standin-Sni") != "web.test" || resp.Header.Get("X-Standin-Host") != "other.test" {
		t.Fatalf("HTTPS: %q, headers %v", body, resp.Header)
	}
	get("", web.String(), nil)                           // no SNI: a certificate for the address
	get("hidden.test", "hidden.test", n.ECHConfigList()) // the real name hidden by ECH
	want := []Seen{
		{SNI: "web.test", Host: "other.test", Path: "/path"},
		{Host: web.String(), Path: "/path"},
		{SNI: "hidden.test", ECH: true, Host: "hidden.test", Path: "/path"},
	}
	if got := tlsSrv.Seen(); !slices.Equal(got, want) || tlsSrv.Hits() != 3 {
		t.Fatalf("TLS server saw %+v in %d connections, want %+v in 3", got, tlsSrv.Hits(), want)
	}

	d := n.ServeDNS(ns, map[string]netip.Addr{"web.test.": web})
	doh := n.ServeDoH(netip.AddrPortFrom(ns, 443), d)
	dot := n.ServeDoT(ns, d)
	lookup := func(via string) []string {
		t.Helper()
		q := new(dns.Msg)
		q.SetQuestion("web.test.", dns.TypeA)
		var m *dns.Msg
		var err error
		switch via {
		case "udp", "tcp":
			m, _, err = (&dns.Client{Net: via}).ExchangeContext(ctx, q, netip.AddrPortFrom(ns, 53).String())
		case "dot":
			m, _, err = (&dns.Client{Net: "tcp-tls", TLSConfig: &tls.Config{RootCAs: n.CA(), ServerName: "dot.test"}}).ExchangeContext(ctx, q, dot.Addr.String())
		case "doh-get", "doh-post":
			wire, _ := q.Pack()
			var req *http.Request
			if via == "doh-get" {
				req, _ = http.NewRequestWithContext(ctx, "GET", doh.URL+"?dns="+base64.RawURLEncoding.EncodeToString(wire), nil)
			} else {
				req, _ = http.NewRequestWithContext(ctx, "POST", doh.URL, bytes.NewReader(wire))
				req.Header.Set("Content-Type", "application/dns-message")
			}
			tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: n.CA(), ServerName: "doh.test"}}
			defer tr.CloseIdleConnections()
			var resp *http.Response
			if resp, err = tr.RoundTrip(req); err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				m = new(dns.Msg)
				err = m.Unpack(body)
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", via, err)
		}
		var got []string
		for _, rr := range m.Answer {
			if a, ok := rr.(*dns.A); ok {
				got = append(got, a.A.String())
			}
		}
		return got
	}
	for _, via := range []string{"udp", "tcp", "dot", "doh-get", "doh-post"} {
		if got := lookup(via); !slices.Equal(got, []string{web.String()}) {
			t.Errorf("%s: web.test = %v, want %s", via, got, web)
		}
	}
	d.Set("web.test", untouched, web) // changed while serving, seen on every transport
	for _, via := range []string{"udp", "tcp", "dot", "doh-get", "doh-post"} {
		if got := lookup(via); !slices.Equal(got, []string{untouched.String(), web.String()}) {
			t.Errorf("%s after Set: web.test = %v", via, got)
		}
	}
	if got := dot.Seen(); len(got) != 2 || got[0].SNI != "dot.test" {
		t.Errorf("DoT saw %+v", got)
	}
	if got := doh.Seen(); len(got) != 4 || got[0].SNI != "doh.test" || got[0].Path != "/dns-query" {
		t.Errorf("DoH saw %+v", got)
	}
	if q := d.Queries(); len(q) != 10 {
		t.Errorf("%d queries, want 10: %q", len(q), q)
	}

	banner := n.ServeBanner(netip.AddrPortFrom(web, 2222), "SSH-2.0-standin")
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", banner.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); line != "SSH-2.0-standin\n" {
		t.Fatalf("banner %q, %v", line, err)
	}
	io.WriteString(c, "ping\n")
	if line, err := r.ReadString('\n'); line != "ping\n" {
		t.Fatalf("echo %q, %v", line, err)
	}
	c.Close()

	echo := n.ServeUDPEcho(netip.AddrPortFrom(web, 5000))
	uc, err := net.Dial("udp", echo.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	buf := make([]byte, 64)
	var got string
	for i := 0; got == "" && i < 10; i++ { // UDP may drop a datagram; retry a few times
		uc.Write([]byte("hello"))
		uc.SetReadDeadline(time.Now().Add(3 * time.Second))
		if m, err := uc.Read(buf); err == nil {
			got = string(buf[:m])
		}
	}
	if got != "hello" || echo.Hits() < 1 || banner.Hits() != 1 {
		t.Fatalf("UDP echo %q (hits %d), banner hits %d", got, echo.Hits(), banner.Hits())
	}
	if idle.Hits() != 0 || len(idle.Seen()) != 0 {
		t.Fatalf("a server nobody dialed counts %d hits", idle.Hits())
	}
}
