package ingress

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

const testID = "0b9f6a1e-3c1d-4a53-9d0e-6f2b8c7a9e10"

// routeRequest builds a request with the given host, escaped path and
// headers (name, value pairs).
func routeRequest(t testing.TB, host, path string, headers ...string) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "http://gw.test"+path, nil)
	r.Host = host
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func TestParseRoute(t *testing.T) {
	const sig = "abcdefghijkl2a" // 13 digest chars + key id
	for _, c := range []struct {
		name    string
		host    string
		path    string
		headers []string
		want    Route
		wantErr string // "" ok, "none" ErrNoRoute, else a RouteError containing it
	}{
		{name: "header", host: "gw.test", path: "/a/b?q=1", headers: []string{api.HeaderIngressTo, testID + "-8080"},
			want: Route{SandboxID: testID, Port: 8080, Path: "/a/b", Mode: ModeHeader}},
		{name: "header root", host: "gw.test", path: "", headers: []string{api.HeaderIngressTo, "abc-1"},
			want: Route{SandboxID: "abc", Port: 1, Path: "/", Mode: ModeHeader}},
		{name: "legacy header", host: "gw.test", path: "/x", headers: []string{api.HeaderIngressLegacy, testID + "-65535"},
			want: Route{SandboxID: testID, Port: 65535, Path: "/x", Mode: ModeHeader}},
		{name: "header signed", host: "gw.test", path: "/x", headers: []string{api.HeaderIngressTo, testID + "-8080-t0ab12-" + sig},
			want: Route{SandboxID: testID, Port: 8080, Expires: "t0ab12", Signature: sig, Path: "/x", Mode: ModeHeader}},
		{name: "header wins over path", host: "gw.test", path: "/other/9000/x", headers: []string{api.HeaderIngressTo, "abc-80"},
			want: Route{SandboxID: "abc", Port: 80, Path: "/other/9000/x", Mode: ModeHeader}},
		{name: "subdomain", host: testID + "-8080.sb.example.test:8443", path: "/p",
			want: Route{SandboxID: testID, Port: 8080, Path: "/p", Mode: ModeSubdomain}},
		{name: "subdomain upper case", host: "ABC-8080.SB.example.test", path: "/p",
			want: Route{SandboxID: "abc", Port: 8080, Path: "/p", Mode: ModeSubdomain}},
		{name: "subdomain signed", host: "abc-8080-t0ab12-" + sig + ".sb.example.test.", path: "/",
			want: Route{SandboxID: "abc", Port: 8080, Expires: "t0ab12", Signature: sig, Path: "/", Mode: ModeSubdomain}},
		{name: "path", host: "gw.test", path: "/" + testID + "/8080/static/app.js?v=2",
			want: Route{SandboxID: testID, Port: 8080, Path: "/static/app.js", Mode: ModePath}},
		{name: "path bare", host: "gw.test", path: "/abc/8080",
			want: Route{SandboxID: "abc", Port: 8080, Mode: ModePath}},
		{name: "path slash", host: "gw.test", path: "/abc/8080/",
			want: Route{SandboxID: "abc", Port: 8080, Path: "/", Mode: ModePath}},
		{name: "path escaped rest", host: "gw.test", path: "/abc/8080/a%2Fb//c",
			want: Route{SandboxID: "abc", Port: 8080, Path: "/a%2Fb//c", Mode: ModePath}},
		{name: "path signed", host: "gw.test", path: "/abc/8080/t0ab12/" + sig + "/api/x",
			want: Route{SandboxID: "abc", Port: 8080, Expires: "t0ab12", Signature: sig, Path: "/api/x", Mode: ModePath}},
		{name: "path signed bare", host: "gw.test", path: "/abc/8080/t0ab12/" + sig,
			want: Route{SandboxID: "abc", Port: 8080, Expires: "t0ab12", Signature: sig, Mode: ModePath}},
		{name: "path not signature shaped", host: "gw.test", path: "/abc/8080/t0ab12/index.html",
			want: Route{SandboxID: "abc", Port: 8080, Path: "/t0ab12/index.html", Mode: ModePath}},
		{name: "domain itself is no route", host: "sb.example.test", path: "/abc/8080/",
			want: Route{SandboxID: "abc", Port: 8080, Path: "/", Mode: ModePath}},
		{name: "other host falls to path", host: "abc-8080.elsewhere.test", path: "/healthz", wantErr: "none"},
		{name: "no route", host: "gw.test", path: "/", wantErr: "none"},
		{name: "health is no route", host: "gw.test", path: "/healthz", wantErr: "none"},
		{name: "path port zero", host: "gw.test", path: "/abc/0/x", wantErr: "none"},
		{name: "header empty", host: "gw.test", path: "/", headers: []string{api.HeaderIngressTo, ""}, wantErr: "empty"},
		{name: "header twice", host: "gw.test", path: "/", headers: []string{api.HeaderIngressTo, "a-1", api.HeaderIngressTo, "a-2"}, wantErr: "once"},
		{name: "header no port", host: "gw.test", path: "/", headers: []string{api.HeaderIngressTo, "abc"}, wantErr: "want"},
		{name: "header port too big", host: "gw.test", path: "/", headers: []string{api.HeaderIngressTo, "abc-65536"}, wantErr: "port"},
		{name: "header port leading zero", host: "gw.test", path: "/", headers: []string{api.HeaderIngressTo, "abc-08080"}, wantErr: "port"},
		{name: "header bad id", host: "gw.test", path: "/", headers: []string{api.HeaderIngressTo, "a/b-80"}, wantErr: "sandbox id"},
		{name: "header id dash end", host: "gw.test", path: "/", headers: []string{api.HeaderIngressTo, "abc--80"}, wantErr: "sandbox id"},
		{name: "header bad signature", host: "gw.test", path: "/", headers: []string{api.HeaderIngressTo, "abc-80-t0ab12-XYZ"}, wantErr: "signature"},
		{name: "header bad expiry", host: "gw.test", path: "/", headers: []string{api.HeaderIngressTo, "abc-80-T0-" + sig}, wantErr: "expiry"},
		{name: "subdomain two labels", host: "x.abc-8080.sb.example.test", path: "/", wantErr: "one DNS label"},
		{name: "subdomain no port", host: "abc.sb.example.test", path: "/", wantErr: "want"},
		{name: "subdomain malformed", host: "abc_8080.sb.example.test", path: "/", wantErr: "want"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseRoute(routeRequest(t, c.host, c.path, c.headers...), "sb.example.test")
			switch {
			case c.wantErr == "none":
				if !errors.Is(err, ErrNoRoute) {
					t.Fatalf("ParseRoute = %+v, %v; want ErrNoRoute", got, err)
				}
			case c.wantErr != "":
				var re *RouteError
				if !errors.As(err, &re) || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("ParseRoute = %+v, %v; want a RouteError about %q", got, err, c.wantErr)
				}
			case err != nil:
				t.Fatalf("ParseRoute: %v", err)
			case got != c.want:
				t.Fatalf("ParseRoute = %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestParseRouteNoDomain: without a domain, hosts are never routes.
func TestParseRouteNoDomain(t *testing.T) {
	_, err := ParseRoute(routeRequest(t, "abc-8080.sb.example.test", "/"), "")
	if !errors.Is(err, ErrNoRoute) {
		t.Fatalf("err = %v, want ErrNoRoute", err)
	}
}

// FuzzParseRoute: no input makes ParseRoute panic, what it accepts is
// well-formed, and every route SignedRoute makes parses back, in each
// mode, to what was signed, and verifies.
func FuzzParseRoute(f *testing.F) {
	keys, err := ParseKeys([]string{"k:" + strings.Repeat("QUJD", 11)})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []struct {
		route, host, path string
		port              uint16
		exp               int64
	}{
		{testID + "-8080", "gw.test", "/", 8080, 1_800_000_000},
		{testID + "-8080-t0ab12-abcdefghijkl2a", testID + "-8080.sb.test", "/" + testID + "/8080/x", 1, 0},
		{"", "a-1.sb.test:80", "/a/1/t0ab12/abcdefghijkl2a/rest?q", 65535, 1<<62 - 1},
		{"a--1", "..sb.test", "//", 443, -5},
		{"x-0-0-0", "[::1]:80", "/a%2f/1/", 22, 42},
		{"a.b_c-65535", "a.b-1.sb.test", "/a.b/65535/%zz", 7, 1},
	} {
		f.Add(s.route, s.host, s.path, s.port, s.exp)
	}
	f.Fuzz(func(t *testing.T, header, host, path string, port uint16, exp int64) {
		hdr := http.Header{}
		if header != "" {
			hdr.Set(api.HeaderIngressTo, header)
		}
		for _, h := range []http.Header{hdr, nil} {
			rt, err := ParseRoute(fuzzRequest(host, path, h), "sb.test")
			if err != nil {
				var re *RouteError
				if !errors.Is(err, ErrNoRoute) && !errors.As(err, &re) {
					t.Fatalf("ParseRoute error %T %v", err, err)
				}
				continue
			}
			if rt.Port < 1 || rt.Port > 65535 || checkSandboxID(rt.SandboxID) != nil || rt.Mode == "" {
				t.Fatalf("ParseRoute accepted %+v", rt)
			}
			if rt.Signed() != (rt.Expires != "") || rt.Signed() && (!isExpires(rt.Expires) || !isSignature(rt.Signature)) {
				t.Fatalf("ParseRoute accepted signed parts %+v", rt)
			}
			if rt.Mode == ModePath && rt.Path != "" && rt.Path[0] != '/' {
				t.Fatalf("path route forwards %q", rt.Path)
			}
		}

		// Round trip: the header input as a sandbox id.
		id := header
		if checkSandboxID(id) != nil || port == 0 {
			return
		}
		expires := time.Unix(int64(uint64(exp)>>1), 0)
		now := expires.Add(-time.Second)
		for _, labelMax := range []int{0, DNSLabelMax} {
			signed, err := keys.SignedRoute(id, int(port), expires, labelMax)
			if err != nil {
				if labelMax == 0 {
					t.Fatalf("SignedRoute(%q, %d): %v", id, port, err)
				}
				continue
			}
			want := Route{SandboxID: id, Port: int(port), Expires: FormatExpires(expires)}
			want.Signature = signed[len(id)+1+len(strconv.Itoa(int(port)))+1+len(want.Expires)+1:]
			reqs := map[string]*http.Request{
				ModeHeader: fuzzRequest("gw.test", "/rest", http.Header{"Opensandbox-Ingress-To": {signed}}),
				ModePath:   fuzzRequest("gw.test", "/"+id+"/"+strconv.Itoa(int(port))+"/"+want.Expires+"/"+want.Signature+"/rest", nil),
			}
			if labelMax > 0 && strings.ToLower(id) == id && !strings.ContainsAny(id, "._") {
				reqs[ModeSubdomain] = fuzzRequest(signed+".sb.test", "/rest", nil)
			}
			for mode, r := range reqs {
				got, err := ParseRoute(r, "sb.test")
				if err != nil {
					t.Fatalf("%s route of %q: %v", mode, signed, err)
				}
				w := want
				w.Mode, w.Path = mode, "/rest"
				if got != w {
					t.Fatalf("%s route of %q = %+v, want %+v", mode, signed, got, w)
				}
				if err := keys.Verify(got.SandboxID, got.Port, got.Expires, got.Signature, now); err != nil {
					t.Fatalf("%s route of %q does not verify: %v", mode, signed, err)
				}
			}
		}
		// The unsigned form too.
		unsigned := id + "-" + strconv.Itoa(int(port))
		got, err := ParseRoute(fuzzRequest("gw.test", "/", http.Header{"Opensandbox-Ingress-To": {unsigned}}), "")
		if err != nil || got.SandboxID != id || got.Port != int(port) || got.Signed() {
			t.Fatalf("route %q = %+v, %v", unsigned, got, err)
		}
	})
}

// fuzzRequest builds a request without httptest (which panics on some
// inputs the gateway may still be sent).
func fuzzRequest(host, rawPath string, headers http.Header) *http.Request {
	r, err := http.NewRequest(http.MethodGet, "http://gw.test/", nil)
	if err != nil {
		panic(err)
	}
	r.Host = host
	r.URL.Path, r.URL.RawPath = rawPath, rawPath
	if headers != nil {
		r.Header = headers
	}
	return r
}

// BenchmarkParseRoute: the per-request cost of finding the route, and
// of checking its credentials.
func BenchmarkParseRoute(b *testing.B) {
	keys, err := ParseKeys([]string{"k:" + strings.Repeat("QUJD", 11)})
	if err != nil {
		b.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	signed, _ := keys.SignedRoute(testID, 8080, exp, DNSLabelMax)
	tok, _ := keys.AccessToken(testID)
	cases := []struct {
		name string
		r    *http.Request
	}{
		{"header", routeRequest(b, "gw.test", "/a/b", api.HeaderIngressTo, testID+"-8080", api.HeaderSecureAccess, tok)},
		{"subdomain-signed", routeRequest(b, signed+".sb.test", "/a/b")},
		{"path", routeRequest(b, "gw.test", "/"+testID+"/8080/a/b", api.HeaderSecureAccess, tok)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rt, err := ParseRoute(c.r, "sb.test")
				if err != nil || rt.SandboxID != testID || rt.Port != 8080 {
					b.Fatalf("ParseRoute = %+v, %v", rt, err)
				}
				if rt.Signed() {
					err = keys.Verify(rt.SandboxID, rt.Port, rt.Expires, rt.Signature, time.Now())
				} else if !keys.CheckAccessToken(rt.SandboxID, c.r.Header.Get(api.HeaderSecureAccess)) {
					err = ErrBadSignature
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
