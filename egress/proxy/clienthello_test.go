package proxy

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
)

// ext is one ClientHello extension for buildHello.
type ext struct {
	typ  uint16
	data []byte
}

// sniExt is a server_name extension holding the given host names.
func sniExt(names ...string) ext {
	var list []byte
	for _, n := range names {
		list = append(list, serverNameTypeHostName)
		list = binary.BigEndian.AppendUint16(list, uint16(len(n)))
		list = append(list, n...)
	}
	data := binary.BigEndian.AppendUint16(nil, uint16(len(list)))
	return ext{extServerName, append(data, list...)}
}

// echExt is an outer encrypted_client_hello extension (its content is
// not looked at).
func echExt() ext {
	return ext{extECH, []byte{0, 0, 1, 0, 1, 0x2a, 0, 0, 0, 0}}
}

// buildHello returns a ClientHello with exts in one TLS record, or in
// records of at most split bytes when split > 0.
func buildHello(split int, exts ...ext) []byte {
	var body []byte
	body = append(body, 3, 3)                // legacy_version
	body = append(body, make([]byte, 32)...) // random
	body = append(body, 0)                   // session_id
	body = append(body, 0, 2, 0x13, 0x01)    // cipher_suites
	body = append(body, 1, 0)                // compression_methods
	var e []byte
	for _, x := range exts {
		e = binary.BigEndian.AppendUint16(e, x.typ)
		e = binary.BigEndian.AppendUint16(e, uint16(len(x.data)))
		e = append(e, x.data...)
	}
	if exts != nil {
		body = binary.BigEndian.AppendUint16(body, uint16(len(e)))
		body = append(body, e...)
	}
	msg := []byte{handshakeTypeClientHello, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}
	msg = append(msg, body...)
	if split <= 0 {
		split = len(msg)
	}
	var out []byte
	for len(msg) > 0 {
		n := min(split, len(msg))
		out = append(out, recordTypeHandshake, 3, 1, byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// goClientHello returns the first TLS record crypto/tls sends as a
// client with cfg.
func goClientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, cfg).Handshake()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, 5+(int(hdr[3])<<8|int(hdr[4])))
	copy(rec, hdr)
	if _, err := io.ReadFull(b, rec[5:]); err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestParseClientHello(t *testing.T) {
	withSNI := goClientHello(t, &tls.Config{ServerName: "Allowed.Test"})
	noSNI := goClientHello(t, &tls.Config{InsecureSkipVerify: true})
	cases := []struct {
		name    string
		in      []byte
		want    clientHello
		wantErr error
	}{
		{"go client", withSNI, clientHello{serverName: "Allowed.Test", hasServerName: true}, nil},
		{"go client without SNI", noSNI, clientHello{}, nil},
		{"built", buildHello(0, sniExt("a.test")), clientHello{serverName: "a.test", hasServerName: true}, nil},
		{"split records", buildHello(7, sniExt("a.test")), clientHello{serverName: "a.test", hasServerName: true}, nil},
		{"one byte records", buildHello(1, sniExt("a.test"), echExt()), clientHello{serverName: "a.test", hasServerName: true, encrypted: true}, nil},
		{"no extensions", buildHello(0), clientHello{}, nil},
		{"ECH", buildHello(0, sniExt("public.test"), echExt()), clientHello{serverName: "public.test", hasServerName: true, encrypted: true}, nil},
		{"ESNI", buildHello(0, ext{extESNI, []byte{1}}), clientHello{encrypted: true}, nil},
		{"two host names", buildHello(0, sniExt("a.test", "b.test")), clientHello{}, errMalformed},
		{"two SNI extensions", buildHello(0, sniExt("a.test"), sniExt("b.test")), clientHello{}, errMalformed},
		{"empty host name", buildHello(0, sniExt("")), clientHello{}, errMalformed},
		{"empty SNI list", buildHello(0, ext{extServerName, []byte{0, 0}}), clientHello{}, errMalformed},
		{"trailing bytes in SNI", buildHello(0, ext{extServerName, append(sniExt("a.test").data, 0)}), clientHello{}, errMalformed},
		{"not a ClientHello", []byte{0x16, 3, 1, 0, 4, 2, 0, 0, 0}, clientHello{}, errMalformed},
		{"alert record", []byte{0x15, 3, 1, 0, 2, 2, 40}, clientHello{}, errNotTLS},
		{"HTTP", []byte("GET / HTTP/1.1\r\n"), clientHello{}, errNotTLS},
		{"SSLv2 style", []byte{0x80, 0x2e, 1, 3, 1}, clientHello{}, errNotTLS},
		{"bad major version", []byte{0x16, 2, 0, 0, 1}, clientHello{}, errNotTLS},
		{"empty record", []byte{0x16, 3, 1, 0, 0}, clientHello{}, errMalformed},
		{"oversized record", []byte{0x16, 3, 1, 0x40, 1}, clientHello{}, errMalformed},
		{"oversized hello", []byte{0x16, 3, 1, 0, 4, 1, 0x10, 0, 0}, clientHello{}, errMalformed},
		{"CCS after a partial hello", append(buildHello(10, sniExt("a.test"))[:15], 0x14, 3, 3, 0, 1, 1), clientHello{}, errMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseClientHello(c.in)
			if !errors.Is(err, c.wantErr) || (err == nil && got != c.want) {
				t.Fatalf("parseClientHello(%d bytes) = %+v, %v; want %+v, %v", len(c.in), got, err, c.want, c.wantErr)
			}
		})
	}
}

// TestParseClientHelloPrefixes checks that every proper prefix of a
// ClientHello asks for more bytes, so the proxy never decides early.
func TestParseClientHelloPrefixes(t *testing.T) {
	for _, in := range [][]byte{
		goClientHello(t, &tls.Config{ServerName: "allowed.test"}),
		buildHello(5, sniExt("a.test")),
	} {
		for i := range len(in) {
			if _, err := parseClientHello(in[:i]); err != errIncomplete {
				t.Fatalf("prefix of %d/%d bytes: err %v, want errIncomplete", i, len(in), err)
			}
		}
	}
}

func FuzzParseClientHello(f *testing.F) {
	// Small seeds (one classic key share) keep minimizing cheap.
	x25519 := []tls.CurveID{tls.X25519}
	f.Add(goClientHello(f, &tls.Config{ServerName: "allowed.test", CurvePreferences: x25519}))
	f.Add(goClientHello(f, &tls.Config{InsecureSkipVerify: true, CurvePreferences: x25519}))
	f.Add(buildHello(0, sniExt("a.test"), echExt()))
	f.Add(buildHello(3, sniExt("a.test")))
	f.Add(buildHello(0, sniExt("a.test", "b.test")))
	f.Add(buildHello(0))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseClientHello(b)
		switch err {
		case nil:
			if got.hasServerName != (got.serverName != "") {
				t.Fatalf("hasServerName %v with name %q", got.hasServerName, got.serverName)
			}
			again, err := parseClientHello(append(append([]byte(nil), b...), "trailing"...))
			if err != nil || again != got {
				t.Fatalf("bytes after a complete hello changed the result: %+v, %v", again, err)
			}
		case errIncomplete, errNotTLS, errMalformed:
			if got != (clientHello{}) {
				t.Fatalf("error %v with a result %+v", err, got)
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}
	})
}
