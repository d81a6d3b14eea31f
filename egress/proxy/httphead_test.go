package proxy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestParseHTTPHead(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		wantErr error
		want    requestHost // checked when the head parses and destination succeeds
		destErr error
	}{
		{"origin form", "GET /x HTTP/1.1\r\nHost: Allowed.Test:8080\r\nAccept: */*\r\n\r\n", nil, requestHost{name: "allowed.test", port: 8080}, nil},
		{"bare LF", "GET / HTTP/1.0\nHost: a.test\n\n", nil, requestHost{name: "a.test"}, nil},
		{"no Host", "GET / HTTP/1.0\r\n\r\n", nil, requestHost{}, nil},
		{"Host is an address", "GET / HTTP/1.1\r\nHost: 10.0.0.1:80\r\n\r\n", nil, requestHost{ip: netip.MustParseAddr("10.0.0.1"), port: 80}, nil},
		{"Host is v6", "GET / HTTP/1.1\r\nHost: [::ffff:10.0.0.1]\r\n\r\n", nil, requestHost{ip: netip.MustParseAddr("10.0.0.1")}, nil},
		{"absolute form agrees", "GET http://a.test:80/x HTTP/1.1\r\nHost: A.test\r\n\r\n", nil, requestHost{name: "a.test", port: 80}, nil},
		{"absolute form without Host", "GET http://a.test/x HTTP/1.0\r\n\r\n", nil, requestHost{name: "a.test"}, nil},
		{"absolute form disagrees", "GET http://denied.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", nil, requestHost{}, errHostMismatch},
		{"absolute form userinfo", "GET http://allowed.test@denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n", nil, requestHost{}, errMalformed},
		{"CONNECT", "CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n", nil, requestHost{name: "a.test", port: 443}, nil},
		{"CONNECT without port", "CONNECT a.test HTTP/1.1\r\n\r\n", nil, requestHost{}, errMalformed},
		{"invalid Host", "GET / HTTP/1.1\r\nHost: a test\r\n\r\n", nil, requestHost{}, errMalformed},
		{"numeric name", "GET / HTTP/1.1\r\nHost: 127.1\r\n\r\n", nil, requestHost{}, errMalformed},
		{"bad port", "GET / HTTP/1.1\r\nHost: a.test:99999\r\n\r\n", nil, requestHost{}, errMalformed},
		{"two Host headers", "GET / HTTP/1.1\r\nHost: a.test\r\nhost: b.test\r\n\r\n", errMalformed, requestHost{}, nil},
		{"folded header", "GET / HTTP/1.1\r\nHost: a.test\r\n b.test\r\n\r\n", errMalformed, requestHost{}, nil},
		{"space before colon", "GET / HTTP/1.1\r\nHost : b.test\r\n\r\n", errMalformed, requestHost{}, nil},
		{"stray CR", "GET / HTTP/1.1\r\nX: a\rb\r\nHost: a.test\r\n\r\n", errMalformed, requestHost{}, nil},
		{"head too large", "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", maxHeadLen) + "\r\n\r\n", errMalformed, requestHost{}, nil},
		{"incomplete line", "GET / HTTP/1.1", errIncomplete, requestHost{}, nil},
		{"incomplete head", "GET / HTTP/1.1\r\nHost: a.test\r\n", errIncomplete, requestHost{}, nil},
		{"method prefix", "GE", errIncomplete, requestHost{}, nil},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", errNotHTTP, requestHost{}, nil},
		{"HTTP/0.9", "GET /\r\n", errNotHTTP, requestHost{}, nil},
		{"redis", "SET k v\r\n", errNotHTTP, requestHost{}, nil},
		{"binary", "\x00\x01", errNotHTTP, requestHost{}, nil},
		{"long token", strings.Repeat("A", maxMethodLen+1), errNotHTTP, requestHost{}, nil},
		{"leading space", " GET / HTTP/1.1\r\n", errNotHTTP, requestHost{}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, err := parseHTTPHead([]byte(c.in))
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("parseHTTPHead(%.60q) err = %v, want %v", c.in, err, c.wantErr)
			}
			if err != nil {
				return
			}
			if h.length != len(c.in) {
				t.Fatalf("parseHTTPHead(%.60q) length = %d, want %d", c.in, h.length, len(c.in))
			}
			got, err := h.destination()
			if !errors.Is(err, c.destErr) || (err == nil && got != c.want) {
				t.Fatalf("destination of %.60q = %+v, %v; want %+v, %v", c.in, got, err, c.want, c.destErr)
			}
		})
	}
}

// TestParseHTTPHeadPrefixes checks that every proper prefix of a head
// asks for more bytes.
func TestParseHTTPHeadPrefixes(t *testing.T) {
	in := "POST http://a.test/x?y HTTP/1.1\r\nHost: a.test\r\nContent-Length: 0\r\n\r\n"
	for i := 1; i < len(in); i++ {
		if _, err := parseHTTPHead([]byte(in[:i])); err != errIncomplete {
			t.Fatalf("prefix %q: err %v, want errIncomplete", in[:i], err)
		}
	}
}

func TestCanonicalName(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"Allowed.Test.", "allowed.test", true},
		{"_srv.a-b.test", "_srv.a-b.test", true},
		{"xn--bcher-kva.test", "xn--bcher-kva.test", true},
		{"a..test", "", false},
		{".", "", false},
		{"", "", false},
		{"a.test/x", "", false},
		{"a.test\x00", "", false},
		{"1.2.3.4", "", false},
		{"0x7f.1", "", false},
		{"a.123", "", false},
		{"123.test", "123.test", true},
		{strings.Repeat("a", 64) + ".test", "", false},
		{strings.Repeat("a.", 127) + "ab", "", false},
	}
	for _, c := range cases {
		got, ok := canonicalName(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("canonicalName(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func FuzzParseHTTPHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET http://a.test:8080/x HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\nrest",
		"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
		"OPTIONS * HTTP/1.0\n\n",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHTTPHead(b)
		switch err {
		case nil:
			if h.length <= 0 || h.length > len(b) || h.length > maxHeadLen {
				t.Fatalf("length %d of %d bytes", h.length, len(b))
			}
		case errIncomplete:
			if len(b) >= maxHeadLen {
				t.Fatalf("incomplete at %d bytes", len(b))
			}
			return
		case errNotHTTP, errMalformed:
			return
		default:
			t.Fatalf("unexpected error %v", err)
		}
		rh, err := h.destination()
		if err != nil {
			return
		}
		if rh.name != "" {
			if c, ok := canonicalName(rh.name); !ok || c != rh.name {
				t.Fatalf("destination name %q is not canonical", rh.name)
			}
			if rh.ip.IsValid() {
				t.Fatalf("destination has a name %q and an address %v", rh.name, rh.ip)
			}
		}
		if rh.ip.IsValid() && rh.ip.Is4In6() {
			t.Fatalf("destination address %v is not unmapped", rh.ip)
		}
	})
}
