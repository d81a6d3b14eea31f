package vault

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
)

// testMatcher allows the hosts the tests bind, through explicit rules.
func testMatcher(t testing.TB) *egress.Matcher {
	t.Helper()
	p, err := egress.NewPolicy(api.NetworkPolicy{DefaultAction: "deny", Egress: []api.NetworkRule{
		{Action: "deny", Target: "blocked.example.test"},
		{Action: "allow", Target: "api.github.test"},
		{Action: "allow", Target: "uploads.github.test"},
		{Action: "allow", Target: "*.example.test"},
		{Action: "allow", Target: "*.other.test"},
		{Action: "allow", Target: "plain.test"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := egress.NewMatcher(egress.Overlay{}, p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func testOptions(t testing.TB) Options {
	return Options{HostAllowed: testMatcher(t).BindingHostAllowed}
}

// createReq decodes a create request written as JSON.
func createReq(t testing.TB, body string) api.CredentialVaultCreateRequest {
	t.Helper()
	req, err := ParseCreate([]byte(body))
	if err != nil {
		t.Fatalf("ParseCreate(%s): %v", body, err)
	}
	return req
}

func mutationReq(t testing.TB, body string) api.CredentialVaultMutationRequest {
	t.Helper()
	req, err := ParseMutation([]byte(body))
	if err != nil {
		t.Fatalf("ParseMutation(%s): %v", body, err)
	}
	return req
}

func mustCreate(t testing.TB, body string, opt Options) *Vault {
	t.Helper()
	v, err := Create(createReq(t, body), opt)
	if err != nil {
		t.Fatalf("Create(%s): %v", body, err)
	}
	return v
}

const baseVault = `{
	"credentials": [
		{"name": "gh-token", "source": {"type": "inline", "value": "ghp_SECRET1"}},
		{"name": "api-key", "source": {"value": "key-SECRET2"}}
	],
	"bindings": [
		{"name": "github", "match": {"hosts": ["API.github.test."]}, "auth": {"type": "bearer", "credential": "gh-token"}},
		{"name": "example", "match": {"hosts": ["*.example.test"], "methods": ["get", "POST"], "paths": ["/v1/*", "/health"]},
		 "auth": {"type": "apiKey", "name": "x-api-key", "credential": "api-key"}}
	]
}`

func TestCreateState(t *testing.T) {
	v := mustCreate(t, baseVault, testOptions(t))
	got := v.State()
	want := api.CredentialVaultState{
		Revision: 1,
		Credentials: []api.CredentialMetadata{
			{Name: "api-key", SourceType: "inline", Revision: 1},
			{Name: "gh-token", SourceType: "inline", Revision: 1},
		},
		Bindings: []api.CredentialBindingMetadata{
			{Name: "example", Revision: 1,
				Match: api.CredentialMatch{Hosts: []string{"*.example.test"}, Schemes: []string{"https"}, Ports: []int{443},
					Methods: []string{"GET", "POST"}, Paths: []string{"/v1/*", "/health"}},
				Auth: api.CredentialAuthMetadata{Type: "apiKey", Name: "X-Api-Key"}},
			{Name: "github", Revision: 1,
				Match: api.CredentialMatch{Hosts: []string{"api.github.test"}, Schemes: []string{"https"}, Ports: []int{443},
					Methods: []string{"GET", "POST", "PUT", "PATCH", "DELETE"}, Paths: []string{"/*"}},
				Auth: api.CredentialAuthMetadata{Type: "bearer"}},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("State =\n%+v\nwant\n%+v", got, want)
	}
	data, _ := json.Marshal(got)
	if strings.Contains(string(data), `"credential":`) || strings.Contains(string(data), "SECRET") {
		t.Errorf("State JSON leaks credential names or values: %s", data)
	}
	if c, ok := v.Credential("gh-token"); !ok || c != (api.CredentialMetadata{Name: "gh-token", SourceType: "inline", Revision: 1}) {
		t.Errorf("Credential(gh-token) = %+v, %v", c, ok)
	}
	if _, ok := v.Credential("nope"); ok {
		t.Error("Credential(nope) found")
	}
	if b, ok := v.Binding("github"); !ok || !reflect.DeepEqual(b, want.Bindings[1]) {
		t.Errorf("Binding(github) = %+v, %v", b, ok)
	}
	// An empty vault lists [] and not null.
	empty := mustCreate(t, `{"credentials":[],"bindings":[]}`, testOptions(t))
	data, _ = json.Marshal(empty.State())
	if string(data) != `{"revision":1,"credentials":[],"bindings":[]}` {
		t.Errorf("empty vault state = %s", data)
	}
}

// cred and bind build request JSON for the validation table.
func vaultJSON(creds, bindings string) string {
	return `{"credentials":[` + creds + `],"bindings":[` + bindings + `]}`
}

const okCred = `{"name":"c","source":{"value":"v"}}`

func bindJSON(match, auth string) string {
	return `{"name":"b","match":` + match + `,"auth":` + auth + `}`
}

const bearer = `{"type":"bearer","credential":"c"}`

func TestCreateInvalid(t *testing.T) {
	cases := []struct {
		name, body string
		opt        *Options // nil: testOptions
		want       string   // in the error text
	}{
		{"no credentials field", `{"bindings":[]}`, nil, "credentials: required"},
		{"no bindings field", `{"credentials":[]}`, nil, "bindings: required"},
		{"blank credential name", vaultJSON(`{"name":" ","source":{"value":"v"}}`, ``), nil, "credentials[0].name: required"},
		{"padded credential name", vaultJSON(`{"name":" c","source":{"value":"v"}}`, ``), nil, "leading or trailing spaces"},
		{"control in name", vaultJSON(`{"name":"a\nb","source":{"value":"v"}}`, ``), nil, "control character"},
		{"duplicate credential", vaultJSON(okCred+`,`+okCred, ``), nil, `credentials[1].name: "c" appears more than once`},
		{"source type", vaultJSON(`{"name":"c","source":{"type":"env","value":"v"}}`, ``), nil, `credentials[0].source.type: "env" is not supported`},
		{"empty value", vaultJSON(`{"name":"c","source":{"value":""}}`, ``), nil, "credentials[0].source.value: required"},
		{"CRLF in value", vaultJSON(`{"name":"c","source":{"value":"x\r\nEvil: 1"}}`, ``), nil, "source.value: contains a control character"},
		{"blank binding name", vaultJSON(okCred, `{"name":"","match":{"hosts":["api.github.test"]},"auth":`+bearer+`}`), nil, "bindings[0].name: required"},
		{"duplicate binding", vaultJSON(okCred, bindJSON(`{"hosts":["api.github.test"]}`, bearer)+`,`+bindJSON(`{"hosts":["uploads.github.test"]}`, bearer)), nil, `bindings[1].name: "b" appears more than once`},
		{"no hosts", vaultJSON(okCred, bindJSON(`{}`, bearer)), nil, "bindings[0].match.hosts: required"},
		{"empty host", vaultJSON(okCred, bindJSON(`{"hosts":[""]}`, bearer)), nil, "bindings[0].match.hosts[0]: required"},
		{"ipv4 host", vaultJSON(okCred, bindJSON(`{"hosts":["10.0.0.1"]}`, bearer)), nil, `bindings[0].match.hosts[0]: "10.0.0.1" is an address, want a name`},
		{"ipv6 host", vaultJSON(okCred, bindJSON(`{"hosts":["[2001:db8::1]"]}`, bearer)), nil, "is an address"},
		{"short ipv4 host", vaultJSON(okCred, bindJSON(`{"hosts":["127.1"]}`, bearer)), nil, "looks like an IP address"},
		{"scheme in host", vaultJSON(okCred, bindJSON(`{"hosts":["https://api.github.test"]}`, bearer)), nil, "has a scheme"},
		{"path in host", vaultJSON(okCred, bindJSON(`{"hosts":["api.github.test/v1"]}`, bearer)), nil, "has a path"},
		{"port in host", vaultJSON(okCred, bindJSON(`{"hosts":["api.github.test:443"]}`, bearer)), nil, "has a port"},
		{"single label", vaultJSON(okCred, bindJSON(`{"hosts":["localhost"]}`, bearer)), nil, "not a fully qualified name"},
		{"tld wildcard", vaultJSON(okCred, bindJSON(`{"hosts":["*.test"]}`, bearer)), nil, "at least two labels"},
		{"wildcard under a public suffix (private section)", vaultJSON(okCred, bindJSON(`{"hosts":["*.s3.amazonaws.com"]}`, bearer)), nil, "s3.amazonaws.com is a public suffix"},
		{"wildcard under a public suffix (ICANN section)", vaultJSON(okCred, bindJSON(`{"hosts":["*.co.uk"]}`, bearer)), nil, "co.uk is a public suffix"},
		{"wildcard under a hosting suffix", vaultJSON(okCred, bindJSON(`{"hosts":["*.github.io"]}`, bearer)), nil, "github.io is a public suffix"},
		{"inner star", vaultJSON(okCred, bindJSON(`{"hosts":["a.*.example.test"]}`, bearer)), nil, "'*' is allowed only"},
		{"bad char", vaultJSON(okCred, bindJSON(`{"hosts":["a b.example.test"]}`, bearer)), nil, "not allowed in a host name"},
		{"host not in policy", vaultJSON(okCred, bindJSON(`{"hosts":["api.nowhere.test"]}`, bearer)), nil, `bindings[0].match.hosts[0]: host "api.nowhere.test" is not covered by an explicit allow rule`},
		{"host denied by policy", vaultJSON(okCred, bindJSON(`{"hosts":["blocked.example.test"]}`, bearer)), nil, "the egress policy denies it"},
		{"wildcard needs wildcard rule", vaultJSON(okCred, bindJSON(`{"hosts":["*.github.test"]}`, bearer)), nil, "not covered by an explicit allow rule"},
		{"apex of wildcard rule", vaultJSON(okCred, bindJSON(`{"hosts":["example.test"]}`, bearer)), nil, "not covered"},
		{"http not allowed", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"schemes":["http"],"ports":[80]}`, bearer)), nil, "the operator must allow"},
		{"bad scheme", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"schemes":["ftp"]}`, bearer)), nil, `bindings[0].match.schemes[0]: "ftp" is not supported`},
		{"bad port", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"ports":[8443]}`, bearer)), nil, "bindings[0].match.ports[0]: 8443 is not intercepted"},
		{"bad method", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"methods":["GE T"]}`, bearer)), nil, "bindings[0].match.methods[0]"},
		{"relative path", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"paths":["v1/*"]}`, bearer)), nil, "bindings[0].match.paths[0]: \"v1/*\" does not start with /"},
		{"inner star path", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"paths":["/v1*"]}`, bearer)), nil, "only as a final /*"},
		{"dotdot path", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"paths":["/v1/../x/*"]}`, bearer)), nil, `not in normal form (no ., .. or empty segments): want "/x/*"`},
		{"query path", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"paths":["/v1?a=b"]}`, bearer)), nil, "query or a fragment"},
		{"bad escape path", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"paths":["/v1/%zz"]}`, bearer)), nil, "malformed escape"},
		{"no auth type", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"credential":"c"}`)), nil, "bindings[0].auth.type: required"},
		{"bad auth type", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"digest","credential":"c"}`)), nil, `"digest" is not supported`},
		{"bearer without credential", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"bearer"}`)), nil, "bindings[0].auth.credential: required"},
		{"basic with name", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"basic","credential":"c","name":"X"}`)), nil, `auth.name: not used by type "basic"`},
		{"apiKey without name", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"apiKey","credential":"c"}`)), nil, "bindings[0].auth.name: required"},
		{"apiKey bad header", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"apiKey","name":"X Key","credential":"c"}`)), nil, "not a valid header name"},
		{"apiKey forbidden header", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"apiKey","name":"host","credential":"c"}`)), nil, `"host" may not be set`},
		{"apiKey forbidden TE", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"apiKey","name":"TE","credential":"c"}`)), nil, "may not be set"},
		{"apiKey forbidden xff", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"apiKey","name":"x-forwarded-for","credential":"c"}`)), nil, "may not be set"},
		{"custom none", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"customHeaders","headers":[]}`)), nil, "auth.headers: required"},
		{"custom duplicate", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"customHeaders","headers":[{"name":"X-A","credential":"c"},{"name":"x-a","credential":"c"}]}`)), nil, `auth.headers[1].name: "x-a" appears more than once`},
		{"custom no credential", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"customHeaders","headers":[{"name":"X-A"}]}`)), nil, "auth.headers[0].credential: required"},
		{"custom forbidden", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"customHeaders","headers":[{"name":"Content-Length","credential":"c"}]}`)), nil, "may not be set"},
		{"custom with credential", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"customHeaders","credential":"c","headers":[{"name":"X-A","credential":"c"}]}`)), nil, "auth.credential: not used"},
		{"unknown credential", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"bearer","credential":"nope"}`)), nil, `binding "b": auth.credential: no credential "nope"`},
		{"unknown custom credential", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, `{"type":"customHeaders","headers":[{"name":"X-A","credential":"c"},{"name":"X-B","credential":"d"}]}`)), nil, `auth.headers[1].credential: no credential "d"`},
		{"too many hosts", vaultJSON(okCred, bindJSON(`{"hosts":[`+strings.Repeat(`"plain.test",`, MaxListItems)+`"plain.test"]}`, bearer)), nil, "the limit is"},
		{"no policy rules", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"]}`, bearer)), &Options{HostAllowed: mustEmptyMatcher(t).BindingHostAllowed}, "the egress policy has no rules"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opt := testOptions(t)
			if c.opt != nil {
				opt = *c.opt
			}
			v, err := Create(createReq(t, c.body), opt)
			if err == nil {
				t.Fatalf("Create(%s) = revision %d, want an error containing %q", c.body, v.Revision(), c.want)
			}
			if !errors.Is(err, egress.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Create(%s) = %v, want ErrInvalid containing %q", c.body, err, c.want)
			}
			if strings.Contains(err.Error(), "invalid policy") {
				t.Errorf("error %q reads as a policy error", err)
			}
		})
	}
}

func mustEmptyMatcher(t testing.TB) *egress.Matcher {
	m, err := egress.NewMatcher(egress.Overlay{}, egress.Policy{DefaultAction: "allow"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCreateNormalises(t *testing.T) {
	opt := testOptions(t)
	opt.AllowHTTP = true
	v := mustCreate(t, vaultJSON(okCred, bindJSON(
		`{"hosts":["Plain.Test","plain.test."],"schemes":["HTTP","https","http"],"ports":[80,443,80],"methods":["get","GET","query"],"paths":["/a/*","/a/*","/b%2Dc"]}`,
		`{"type":"customHeaders","headers":[{"name":"x-one","credential":"c"},{"name":"X-TWO","credential":"c"}]}`)), opt)
	b, _ := v.Binding("b")
	want := api.CredentialBindingMetadata{Name: "b", Revision: 1,
		Match: api.CredentialMatch{Hosts: []string{"plain.test"}, Schemes: []string{"http", "https"}, Ports: []int{80, 443},
			Methods: []string{"GET", "QUERY"}, Paths: []string{"/a/*", "/b%2Dc"}},
		Auth: api.CredentialAuthMetadata{Type: "customHeaders"}}
	if !reflect.DeepEqual(b, want) {
		t.Errorf("normalised binding =\n%+v\nwant\n%+v", b, want)
	}
	inj, err := v.Bind(egress.BindRequest{Scheme: "http", Host: "plain.test", Port: 80, Method: "QUERY", Path: "/b-c"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []egress.InjectedHeader{{Name: "X-One", Value: "v"}, {Name: "X-Two", Value: "v"}}; !reflect.DeepEqual(inj.Headers, want) {
		t.Errorf("headers = %+v, want %+v", inj.Headers, want)
	}
}

func TestOverlap(t *testing.T) {
	opt := testOptions(t)
	opt.AllowHTTP = true
	two := func(m1, m2 string) string {
		return vaultJSON(okCred, `{"name":"one","match":`+m1+`,"auth":`+bearer+`},{"name":"two","match":`+m2+`,"auth":`+bearer+`}`)
	}
	cases := []struct {
		name, m1, m2 string
		overlap      bool
	}{
		{"same host", `{"hosts":["api.github.test"]}`, `{"hosts":["api.github.test"]}`, true},
		{"different hosts", `{"hosts":["api.github.test"]}`, `{"hosts":["uploads.github.test"]}`, false},
		{"wildcard covers exact", `{"hosts":["*.example.test"]}`, `{"hosts":["a.b.example.test"]}`, true},
		{"wildcard does not cover apex", `{"hosts":["*.example.test"]}`, `{"hosts":["x.other.test"]}`, false},
		{"nested wildcards", `{"hosts":["*.example.test"]}`, `{"hosts":["*.a.example.test"]}`, true},
		{"equal wildcards", `{"hosts":["*.example.test"]}`, `{"hosts":["*.example.test"]}`, true},
		{"sibling wildcards", `{"hosts":["*.a.example.test"]}`, `{"hosts":["*.b.example.test"]}`, false},
		{"disjoint schemes", `{"hosts":["plain.test"],"schemes":["http"]}`, `{"hosts":["plain.test"],"schemes":["https"]}`, false},
		{"disjoint ports", `{"hosts":["plain.test"],"ports":[80]}`, `{"hosts":["plain.test"],"ports":[443]}`, false},
		{"disjoint methods", `{"hosts":["plain.test"],"methods":["GET"]}`, `{"hosts":["plain.test"],"methods":["POST"]}`, false},
		{"common method", `{"hosts":["plain.test"],"methods":["GET","PUT"]}`, `{"hosts":["plain.test"],"methods":["POST","PUT"]}`, true},
		{"disjoint paths", `{"hosts":["plain.test"],"paths":["/v1/*"]}`, `{"hosts":["plain.test"],"paths":["/v2/*"]}`, false},
		{"nested paths", `{"hosts":["plain.test"],"paths":["/v1/*"]}`, `{"hosts":["plain.test"],"paths":["/v1/admin/*"]}`, true},
		{"exact under prefix", `{"hosts":["plain.test"],"paths":["/v1/*"]}`, `{"hosts":["plain.test"],"paths":["/v1/x"]}`, true},
		{"exact is not the prefix dir", `{"hosts":["plain.test"],"paths":["/v1/*"]}`, `{"hosts":["plain.test"],"paths":["/v1"]}`, false},
		{"different exact", `{"hosts":["plain.test"],"paths":["/a"]}`, `{"hosts":["plain.test"],"paths":["/b"]}`, false},
		{"same exact", `{"hosts":["plain.test"],"paths":["/a"]}`, `{"hosts":["plain.test"],"paths":["/b","/a"]}`, true},
		{"root prefix", `{"hosts":["plain.test"]}`, `{"hosts":["plain.test"],"paths":["/anything"]}`, true},
		{"one of many hosts", `{"hosts":["uploads.github.test","plain.test"]}`, `{"hosts":["api.github.test","plain.test"]}`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Create(createReq(t, two(c.m1, c.m2)), opt)
			switch {
			case c.overlap && (err == nil || !errors.Is(err, egress.ErrInvalid) || !strings.Contains(err.Error(), `bindings "one" and "two" overlap`)):
				t.Errorf("Create(%s, %s) = %v, want an overlap error", c.m1, c.m2, err)
			case !c.overlap && err != nil:
				t.Errorf("Create(%s, %s) = %v, want no error", c.m1, c.m2, err)
			}
		})
	}
}

func TestMutate(t *testing.T) {
	v1 := mustCreate(t, baseVault, testOptions(t))
	opt := testOptions(t)

	// Replace a credential, add one and a binding using it, delete a
	// binding: revision 2; the replaced and added credentials are at 2,
	// the untouched one stays at 1.
	v2, err := v1.Mutate(mutationReq(t, `{
		"expectedRevision": 1,
		"credentials": {"replace": [{"name": "gh-token", "source": {"value": "ghp_NEW"}}],
		                "add": [{"name": "up", "source": {"value": "up-SECRET"}}]},
		"bindings": {"delete": ["example"],
		             "add": [{"name": "uploads", "match": {"hosts": ["uploads.github.test"]}, "auth": {"type": "basic", "credential": "up"}}]}
	}`), opt)
	if err != nil {
		t.Fatal(err)
	}
	st := v2.State()
	wantCreds := []api.CredentialMetadata{
		{Name: "api-key", SourceType: "inline", Revision: 1},
		{Name: "gh-token", SourceType: "inline", Revision: 2},
		{Name: "up", SourceType: "inline", Revision: 2},
	}
	if st.Revision != 2 || !reflect.DeepEqual(st.Credentials, wantCreds) {
		t.Errorf("after mutate: revision %d credentials %+v, want 2 %+v", st.Revision, st.Credentials, wantCreds)
	}
	if len(st.Bindings) != 2 || st.Bindings[0].Name != "github" || st.Bindings[1].Name != "uploads" || st.Bindings[0].Revision != 2 {
		t.Errorf("after mutate: bindings %+v", st.Bindings)
	}
	inj, err := v2.Bind(egress.BindRequest{Scheme: "https", Host: "api.github.test", Port: 443, Method: "GET", Path: "/"})
	if err != nil || inj.Headers[0].Value != "Bearer ghp_NEW" {
		t.Errorf("bind after replace = %+v, %v", inj, err)
	}
	// v1 is unchanged: a vault is a value.
	if v1.Revision() != 1 || len(v1.Bindings()) != 2 {
		t.Errorf("v1 changed: revision %d, %d bindings", v1.Revision(), len(v1.Bindings()))
	}
	if inj, err := v1.Bind(egress.BindRequest{Scheme: "https", Host: "api.github.test", Port: 443, Method: "GET", Path: "/"}); err != nil || inj.Headers[0].Value != "Bearer ghp_SECRET1" {
		t.Errorf("v1 bind = %+v, %v", inj, err)
	}
	// Without expectedRevision there is no check.
	v3, err := v2.Mutate(mutationReq(t, `{"credentials":{"delete":["api-key"]}}`), opt)
	if err != nil || v3.Revision() != 3 {
		t.Fatalf("mutate without expectedRevision = %v", err)
	}
	// Delete then add the same binding name in one request is refused
	// (one operation per name); replace works.
	v4, err := v3.Mutate(mutationReq(t, `{"bindings":{"replace":[{"name":"github","match":{"hosts":["api.github.test"],"paths":["/repos/*"]},"auth":{"type":"bearer","credential":"gh-token"}}]}}`), opt)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := v4.Binding("github"); b.Revision != 4 || !reflect.DeepEqual(b.Match.Paths, []string{"/repos/*"}) {
		t.Errorf("replaced binding = %+v", b)
	}
}

func TestMutateInvalid(t *testing.T) {
	v1 := mustCreate(t, baseVault, testOptions(t))
	cases := []struct {
		name, body string
		conflict   bool
		want       string
	}{
		{"revision mismatch", `{"expectedRevision":2,"credentials":{"delete":["api-key"]}}`, true, "expectedRevision is 2, the vault is at revision 1"},
		{"empty", `{}`, false, "no operations"},
		{"empty ops", `{"credentials":{},"bindings":{"add":[]}}`, false, "no operations"},
		{"delete missing credential", `{"credentials":{"delete":["nope"]}}`, false, `credentials.delete[0]: "nope" does not exist`},
		{"replace missing credential", `{"credentials":{"replace":[{"name":"nope","source":{"value":"x"}}]}}`, false, `credentials.replace[0]: "nope" does not exist`},
		{"add existing credential", `{"credentials":{"add":[{"name":"api-key","source":{"value":"x"}}]}}`, false, `credentials.add[0]: "api-key" already exists`},
		{"credential in two ops", `{"credentials":{"delete":["api-key"],"replace":[{"name":"api-key","source":{"value":"x"}}]}}`, false, `credentials.replace[0]: "api-key" is already in credentials.delete`},
		{"credential twice in one op", `{"credentials":{"add":[{"name":"n","source":{"value":"x"}},{"name":"n","source":{"value":"y"}}]}}`, false, "is already in credentials.add"},
		{"delete used credential", `{"credentials":{"delete":["gh-token"]}}`, false, `binding "github": auth.credential: no credential "gh-token"`},
		{"delete missing binding", `{"bindings":{"delete":["nope"]}}`, false, `bindings.delete[0]: "nope" does not exist`},
		{"add existing binding", `{"bindings":{"add":[{"name":"github","match":{"hosts":["uploads.github.test"]},"auth":{"type":"bearer","credential":"gh-token"}}]}}`, false, `bindings.add[0]: "github" already exists`},
		{"binding delete and add", `{"bindings":{"delete":["github"],"add":[{"name":"github","match":{"hosts":["api.github.test"]},"auth":{"type":"bearer","credential":"gh-token"}}]}}`, false, "is already in bindings.delete"},
		{"added binding invalid", `{"bindings":{"add":[{"name":"x","match":{"hosts":["10.0.0.1"]},"auth":{"type":"bearer","credential":"gh-token"}}]}}`, false, `bindings.add[0].match.hosts[0]: "10.0.0.1" is an address`},
		{"added binding overlaps", `{"bindings":{"add":[{"name":"x","match":{"hosts":["api.github.test"],"paths":["/x"]},"auth":{"type":"bearer","credential":"gh-token"}}]}}`, false, `bindings "github" and "x" overlap`},
		{"bad credential in a valid mix", `{"credentials":{"add":[{"name":"ok","source":{"value":"x"}}],"replace":[{"name":"api-key","source":{"value":""}}]}}`, false, "credentials.replace[0].source.value: required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := v1.Mutate(mutationReq(t, c.body), testOptions(t))
			if err == nil {
				t.Fatalf("Mutate(%s) = revision %d, want an error", c.body, v.Revision())
			}
			kind := egress.ErrInvalid
			if c.conflict {
				kind = ErrConflict
			}
			if !errors.Is(err, kind) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Mutate(%s) = %v, want %v containing %q", c.body, err, kind, c.want)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("error %q holds a value", err)
			}
		})
	}
	if v1.Revision() != 1 || len(v1.Credentials()) != 2 || len(v1.Bindings()) != 2 {
		t.Errorf("failed mutations changed the vault: %+v", v1.State())
	}
}

// TestMutateOrder: deletes apply before replacements and additions, so a
// binding can move to a credential that is added in the same request
// while the old one it used is deleted.
func TestMutateOrder(t *testing.T) {
	v1 := mustCreate(t, baseVault, testOptions(t))
	v2, err := v1.Mutate(mutationReq(t, `{
		"credentials": {"delete": ["gh-token"], "add": [{"name": "gh2", "source": {"value": "ghp_TWO"}}]},
		"bindings": {"replace": [{"name": "github", "match": {"hosts": ["api.github.test"]}, "auth": {"type": "bearer", "credential": "gh2"}}]}
	}`), testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := v2.Credential("gh-token"); ok {
		t.Error("gh-token still there")
	}
	// A binding deleted and another added with the same hosts in one
	// request: the delete applies first, so they do not overlap.
	v3, err := v2.Mutate(mutationReq(t, `{
		"bindings": {"delete": ["github"], "add": [{"name": "github-v2", "match": {"hosts": ["api.github.test"]}, "auth": {"type": "bearer", "credential": "gh2"}}]}
	}`), testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	inj, err := v3.Bind(egress.BindRequest{Scheme: "https", Host: "api.github.test", Port: 443, Method: "GET", Path: "/"})
	if err != nil || inj.Binding != "github-v2" || inj.Headers[0].Value != "Bearer ghp_TWO" {
		t.Errorf("bind = %+v, %v", inj, err)
	}
}

// TestMutateChecksOnlyChangedHosts: a binding left as it was is not
// checked against the policy again; an added one is.
func TestMutateChecksOnlyChangedHosts(t *testing.T) {
	v1 := mustCreate(t, baseVault, testOptions(t))
	var asked []string
	opt := Options{HostAllowed: func(h string) error { asked = append(asked, h); return nil }}
	if _, err := v1.Mutate(mutationReq(t, `{"bindings":{"add":[{"name":"u","match":{"hosts":["uploads.github.test"]},"auth":{"type":"bearer","credential":"gh-token"}}]}}`), opt); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(asked, []string{"uploads.github.test"}) {
		t.Errorf("HostAllowed asked about %q, want only the added host", asked)
	}
	// CheckHosts asks about every one, and names the binding refused.
	err := v1.CheckHosts(func(h string) error {
		if h == "*.example.test" {
			return errors.New("nope")
		}
		return nil
	})
	if !errors.Is(err, egress.ErrInvalid) || !strings.Contains(err.Error(), `binding "example": match.hosts: nope`) {
		t.Errorf("CheckHosts = %v", err)
	}
	if err := (*Vault)(nil).CheckHosts(func(string) error { return errors.New("x") }); err != nil {
		t.Errorf("nil vault CheckHosts = %v", err)
	}
}

func TestParseStrict(t *testing.T) {
	for _, c := range []struct {
		name, body, want string
	}{
		{"empty", "  ", "empty body"},
		{"not an object", `[]`, "want an object"},
		{"null", `null`, "want an object"},
		{"unknown field", `{"credentials":[],"bindings":[],"extra":1}`, `unknown field "extra"`},
		{"nested unknown field", `{"credentials":[{"name":"c","source":{"value":"v","ttl":3}}],"bindings":[]}`, `unknown field "ttl"`},
		{"trailing data", `{"credentials":[],"bindings":[]} {}`, "data after the object"},
		{"trailing garbage", `{"credentials":[],"bindings":[]}x`, "data after the object"},
		{"wrong type", `{"credentials":[{"name":"c","source":{"value":123456789}}],"bindings":[]}`, "cannot use a JSON number"},
		{"truncated", `{"credentials":[`, "decode JSON"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseCreate([]byte(c.body))
			if !errors.Is(err, egress.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("ParseCreate(%s) = %v, want ErrInvalid containing %q", c.body, err, c.want)
			}
			if err != nil && strings.Contains(err.Error(), "123456789") {
				t.Errorf("error %q holds the value", err)
			}
		})
	}
	if _, err := ParseMutation([]byte(`{"expectedRevision":1,"credentials":{"remove":["x"]}}`)); !errors.Is(err, egress.ErrInvalid) {
		t.Errorf("ParseMutation with an unknown op = %v, want ErrInvalid", err)
	}
	req, err := ParseMutation([]byte(`{"expectedRevision":7,"bindings":{"delete":["a"]}}`))
	if err != nil || req.ExpectedRevision == nil || *req.ExpectedRevision != 7 || req.Bindings.Delete[0] != "a" {
		t.Errorf("ParseMutation = %+v, %v", req, err)
	}
}
