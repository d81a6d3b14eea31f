package lifecycle

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/internal/httpx"
	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/sandbox"
)

// sizedRuntime is the fake runtime with a machine size and extension keys
// of its own, as the Docker and Kubernetes runtimes have.
type sizedRuntime struct {
	*fake.Runtime
	size    sandbox.HostSize
	sizeErr error
	keys    []string
}

func (r *sizedRuntime) HostSize(context.Context) (sandbox.HostSize, error) { return r.size, r.sizeErr }
func (r *sizedRuntime) ExtensionKeys() []string                            { return r.keys }

var (
	_ sandbox.HostSizer       = (*sizedRuntime)(nil)
	_ sandbox.ExtensionReader = (*sizedRuntime)(nil)
)

// wantRefusal fails unless err is a 400 with code whose message holds
// every one of words.
func wantRefusal(t *testing.T, what string, err error, code string, words ...string) {
	t.Helper()
	var he *httpx.Error
	if !errors.As(err, &he) || he.Status != http.StatusBadRequest || he.Code != code {
		t.Fatalf("%s: %v, want 400 %s", what, err, code)
	}
	for _, w := range words {
		if !strings.Contains(he.Message, w) {
			t.Fatalf("%s: message %q does not say %q", what, he.Message, w)
		}
	}
}

func TestExtensionKeys(t *testing.T) {
	plain := hostPathServer(t)
	docker, err := New(NewManager(&sizedRuntime{Runtime: fake.New(), keys: []string{"docker.runtime"}}, ManagerConfig{}),
		Config{APIKey: "k", AllowedExtensions: []string{"team.*", "billing.project"}})
	if err != nil {
		t.Fatal(err)
	}
	anything, err := New(NewManager(fake.New(), ManagerConfig{}), Config{APIKey: "k", AllowedExtensions: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		srv     *Server
		ext     map[string]string
		unknown []string // nil: accepted
	}{
		{"none", plain, nil, nil},
		{"the server's own", plain, map[string]string{"poolRef": "p", "access.renew.extend.seconds": "300"}, nil},
		{"privileged ask", plain, map[string]string{"docker.privileged": "true"}, []string{`"docker.privileged"`}},
		{"several unknown, all named", plain, map[string]string{"docker.capAdd": "SYS_ADMIN", "docker.network": "host", "poolRef": ""},
			[]string{`"docker.capAdd"`, `"docker.network"`}},
		{"an empty value is still a key", plain, map[string]string{"x": ""}, []string{`"x"`}},
		{"a runtime key without that runtime", plain, map[string]string{"docker.runtime": "runsc"}, []string{`"docker.runtime"`}},
		{"the runtime's key", docker, map[string]string{"docker.runtime": "runsc"}, nil},
		{"another runtime's key", docker, map[string]string{"kubernetes.runtimeClassName": "gvisor"}, []string{`"kubernetes.runtimeClassName"`}},
		{"allowed by prefix", docker, map[string]string{"team.owner": "ml", "team.": "x"}, nil},
		{"allowed exactly", docker, map[string]string{"billing.project": "p"}, nil},
		{"near an allowed key", docker, map[string]string{"billing.project2": "p"}, []string{`"billing.project2"`}},
		{"near an allowed prefix", docker, map[string]string{"teams.owner": "ml"}, []string{`"teams.owner"`}},
		{"everything allowed", anything, map[string]string{"docker.privileged": "true"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.srv.checkExtensionKeys(tt.ext)
			if tt.unknown == nil {
				if err != nil {
					t.Fatalf("checkExtensionKeys(%v) = %v, want accepted", tt.ext, err)
				}
				return
			}
			wantRefusal(t, "checkExtensionKeys", err, codeInvalidParameter, append(tt.unknown, "allowed_extensions", "poolRef")...)
		})
	}
	if err := docker.checkExtensionKeys(map[string]string{"x": "1"}); err == nil || !strings.Contains(err.Error(), "docker.runtime") || !strings.Contains(err.Error(), "team.*") {
		t.Errorf("the refusal should list what the server reads, the runtime's and the allowed keys too: %v", err)
	}
}

func TestAllowedExtensionsConfig(t *testing.T) {
	for _, bad := range [][]string{{""}, {"a*b"}, {"**"}, {"*a*"}} {
		if _, err := New(NewManager(fake.New(), ManagerConfig{}), Config{APIKey: "k", AllowedExtensions: bad}); err == nil || !strings.Contains(err.Error(), "AllowedExtensions") {
			t.Errorf("AllowedExtensions %q: %v, want an error naming the field", bad, err)
		}
	}
}

func TestReservedMount(t *testing.T) {
	tests := []struct {
		path string
		why  string // "" = allowed
	}{
		{"/", "whole image"},
		{"/proc", "/proc"},
		{"/proc/sys", "lies in /proc"},
		{"/sys", "sysfs"},
		{"/sys/fs", "lies in /sys"},
		{"/sys/fs/cgroup", "/sys"},
		{"/dev", "device directory"},
		{"/dev/shm", "/dev"},
		{"/opt/opensandbox", "execd"},
		{"/opt/opensandbox/bin", "execd"},
		{"/opt/opensandbox/bin/execd", "execd"},
		{"/opt", "would hide /opt/opensandbox"},
		{"/data", ""},
		{"/workspace/proc", ""},
		{"/procfs", ""},
		{"/system", ""},
		{"/device", ""},
		{"/devices/x", ""},
		{"/opt/opensandbox2", ""},
		{"/opt/app", ""},
		{"/home/user", ""},
	}
	for _, tt := range tests {
		got := reservedMount(tt.path)
		if (got == "") != (tt.why == "") || !strings.Contains(got, tt.why) {
			t.Errorf("reservedMount(%q) = %q, want %q", tt.path, got, tt.why)
		}
	}
}

func TestCheckExecSize(t *testing.T) {
	val := func(n int) string { return strings.Repeat("v", n) }
	// "K=" + value + NUL is the string execve copies.
	atLimit := val(maxArgStrlen - len("K=") - 1)
	many := map[string]string{}
	for i := range 16 {
		many["V"+strconv.Itoa(i)] = val(126 << 10) // 16 × 126 KiB: each fits, not all together
	}
	tests := []struct {
		name  string
		env   map[string]string
		argv  []string
		words []string // nil: accepted
	}{
		{"nothing", nil, nil, nil},
		{"ordinary", map[string]string{"A": "1", "PATH": "/bin"}, []string{"sleep", "1"}, nil},
		{"one variable at the kernel's limit", map[string]string{"K": atLimit}, nil, nil},
		{"one variable a byte over", map[string]string{"K": atLimit + "v"}, nil, []string{"env K", "131072 bytes", "131071", "MAX_ARG_STRLEN"}},
		{"a 200 KiB value", map[string]string{"BIG": val(200 << 10)}, nil, []string{"env BIG", "MAX_ARG_STRLEN", "128 KiB"}},
		{"one argument over", nil, []string{"sh", val(maxArgStrlen)}, []string{"entrypoint[1]", "MAX_ARG_STRLEN"}},
		{"all together over", many, []string{"x"}, []string{"env and entrypoint", "2 MiB", "ARG_MAX"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkExecSize(tt.env, tt.argv)
			if tt.words == nil {
				if err != nil {
					t.Fatalf("checkExecSize = %v, want accepted", err)
				}
				return
			}
			wantRefusal(t, "checkExecSize", err, codeInvalidParameter, tt.words...)
		})
	}
}

func TestLocalRegistry(t *testing.T) {
	self, _ := os.Hostname()
	tests := []struct {
		ref  string
		want string // part of the reason; "" = not local
	}{
		{"127.0.0.1:5000/x", "loopback"},
		{"127.0.0.1/x", "loopback"},
		{"127.255.1.2:80/x:tag", "loopback"},
		{"[::1]:5000/x", "loopback"},
		{"[::1]/x", "loopback"},
		{"localhost:5000/x", "loopback"},
		{"localhost/x", "loopback"},
		{"LocalHost:5000/x", "loopback"},
		{"registry.localhost:5000/x", "loopback"},
		{"ip6-localhost:5000/x", "loopback"},
		{"localhost.localdomain/x", "loopback"},
		{"169.254.169.254/x", "link-local"},
		{"169.254.0.1:5000/a/b", "link-local"},
		{"[fe80::1]:5000/x", "link-local"},
		{"[febf::1]/x", "link-local"},
		{"0.0.0.0:5000/x", "unspecified"},
		{"0.1.2.3:5000/x", "unspecified"},
		{"[::]:5000/x", "unspecified"},
		{"[::ffff:7f00:1]:5000/x", "loopback"},
		{"[::ffff:a9fe:a9fe]/x", "link-local"},
		{"[0:0:0:0:0:ffff:7f00:1]/x", "loopback"},
		{"127.1:5000/x", "loopback"},
		{"127.0.1:5000/x", "loopback"},
		{"2130706433:5000/x", "loopback"},
		{"0x7f.0.0.1:5000/x", "loopback"},
		{"0x7f000001:5000/x", "loopback"},
		{"0177.0.0.1:5000/x", "loopback"},
		{"0251.0376.0251.0376/x", "link-local"},
		{"169.16689662/x", "link-local"},
		{"python:3.11", ""},
		{"library/python", ""},
		{"2130706433/x", ""}, // no dot or port: a Docker Hub namespace
		{"localhost", ""},    // an image named localhost on Docker Hub
		{"registry.example.com/x", ""},
		{"10.0.0.5:5000/x", ""},
		{"192.168.1.10/x", ""},
		{"172.17.0.1:5000/x", ""},
		{"[2001:db8::1]:5000/x", ""},
		{"127.0.0.1.nip.io/x", ""}, // a name: never resolved
		{"notlocalhost:5000/x", ""},
		{"0x:5000/x", "unspecified"},
		{"08.0.0.1:5000/x", ""}, // not a number to inet_aton: a name
		{"127.0.0.256:5000/x", ""},
		{"1.2.3.4.5:5000/x", ""},
	}
	if self != "" && !loopbackNames[strings.ToLower(self)] {
		tests = append(tests, struct{ ref, want string }{strings.ToLower(self) + ":5000/x", "own host name"})
	}
	for _, tt := range tests {
		got := localRegistry(tt.ref)
		if (got == "") != (tt.want == "") || !strings.Contains(got, tt.want) {
			t.Errorf("localRegistry(%q) = %q, want %q", tt.ref, got, tt.want)
		}
	}
}

func TestParseInetAton(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" = not an address
	}{
		{"1.2.3.4", "1.2.3.4"},
		{"1.2.3", "1.2.0.3"},
		{"1.2", "1.0.0.2"},
		{"16909060", "1.2.3.4"},
		{"0x01020304", "1.2.3.4"},
		{"01.02.03.04", "1.2.3.4"},
		{"0", "0.0.0.0"},
		{"255.255.255.255", "255.255.255.255"},
		{"4294967295", "255.255.255.255"},
		{"1.16777215", "1.255.255.255"},
		{"4294967296", ""},
		{"1.16777216", ""},
		{"256.1.1.1", ""},
		{"1.2.3.4.5", ""},
		{"1..2", ""},
		{"", ""},
		{"09", ""},
		{"0xg", ""},
		{"a.b.c.d", ""},
		{"-1", ""},
		{"+1", ""},
	}
	for _, tt := range tests {
		got, ok := parseInetAton(tt.in)
		if ok != (tt.want != "") || (ok && got.String() != tt.want) {
			t.Errorf("parseInetAton(%q) = %v, %v; want %q", tt.in, got, ok, tt.want)
		}
	}
}

// FuzzLocalRegistry feeds arbitrary references to the registry check: it
// never panics, judges only references that name a registry, and reads a
// dotted quad as the standard parser does.
func FuzzLocalRegistry(f *testing.F) {
	for _, seed := range []string{"127.0.0.1:5000/x", "[::ffff:7f00:1]/x", "0x7f.1/x", "2130706433:1/x", "python", "a/b", "[/x", "1.2.3.4/x"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		why := localRegistry(ref)
		if _, ok := registryHost(ref); !ok && why != "" {
			t.Fatalf("localRegistry(%q) = %q for a reference without a registry", ref, why)
		}
		host, _, _ := strings.Cut(ref, "/")
		host, _, _ = strings.Cut(host, ":")
		if want, err := netip.ParseAddr(host); err == nil && want.Is4() {
			if got, ok := parseInetAton(host); !ok || got != want {
				t.Fatalf("parseInetAton(%q) = %v, %v; the standard parser says %v", host, got, ok, want)
			}
		}
	})
}

func TestFitsHost(t *testing.T) {
	docker := sandbox.HostSize{CPUMillis: 2000, MemoryBytes: 8 << 30, GPUsKnown: true, Where: "the Docker engine's host"}
	gpus := sandbox.HostSize{CPUMillis: 64000, MemoryBytes: 512 << 30, GPUs: 4, GPUsKnown: true, Where: "the largest node of the cluster"}
	unknown := sandbox.HostSize{}
	tests := []struct {
		name  string
		res   sandbox.Resources
		host  sandbox.HostSize
		words []string // nil: fits
	}{
		{"nothing asked", sandbox.Resources{}, docker, nil},
		{"all CPUs", sandbox.Resources{CPUMillis: 2000}, docker, nil},
		{"one CPU too many", sandbox.Resources{CPUMillis: 3000}, docker, []string{"resourceLimits.cpu", "3 CPUs", "the Docker engine's host", "(2)"}},
		{"a thousand CPUs", sandbox.Resources{CPUMillis: 1_000_000}, docker, []string{"1000 CPUs"}},
		{"a fraction over", sandbox.Resources{CPUMillis: 2001}, docker, []string{"2.001 CPUs"}},
		{"all memory", sandbox.Resources{MemoryBytes: 8 << 30}, docker, nil},
		{"10Ti", sandbox.Resources{MemoryBytes: 10 << 40}, docker, []string{"resourceLimits.memory", "10240Gi", "8Gi"}},
		{"a GPU where there is none", sandbox.Resources{GPUs: "1"}, docker, []string{"resourceLimits.gpu", "no GPU"}},
		{"all GPUs where there is none", sandbox.Resources{GPUs: "all"}, docker, []string{"no GPU"}},
		{"GPUs where there are", sandbox.Resources{GPUs: "4"}, gpus, nil},
		{"all GPUs where there are", sandbox.Resources{GPUs: "all"}, gpus, nil},
		{"more GPUs than there are", sandbox.Resources{GPUs: "5"}, gpus, []string{"5 GPUs", "(4)"}},
		{"GPUs of an unknown host", sandbox.Resources{GPUs: "8"}, sandbox.HostSize{CPUMillis: 1000}, nil},
		{"an unknown host", sandbox.Resources{CPUMillis: 1_000_000, MemoryBytes: 1 << 60, GPUs: "9"}, unknown, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := fitsHost("resourceLimits", tt.res, tt.host)
			if tt.words == nil {
				if err != nil {
					t.Fatalf("fitsHost(%+v, %+v) = %v, want it to fit", tt.res, tt.host, err)
				}
				return
			}
			wantRefusal(t, "fitsHost", err, codeInvalidParameter, tt.words...)
		})
	}
}

// TestCreateRefusals: through the HTTP API, each thing a sandbox would
// not get is a 400 naming it, and nothing reaches the runtime; the
// operator's options let through what they allow.
func TestCreateRefusals(t *testing.T) {
	rt := &sizedRuntime{Runtime: fake.New(), keys: []string{"docker.runtime"},
		size: sandbox.HostSize{CPUMillis: 2000, MemoryBytes: 4 << 30, GPUsKnown: true, Where: "the Docker engine's host"}}
	e := newEnvWith(t, rt)
	img := func(uri, extra string) string {
		return `{"image":{"uri":"` + uri + `"},"entrypoint":["sleep","1"],"resourceLimits":{}` + extra + `}`
	}
	tests := []struct {
		name, body, code string
		words            []string
	}{
		{"privileged", img("busybox", `,"extensions":{"docker.privileged":"true"}`), codeInvalidParameter, []string{"docker.privileged"}},
		{"cap add", img("busybox", `,"extensions":{"docker.capAdd":"SYS_ADMIN"}`), codeInvalidParameter, []string{"docker.capAdd"}},
		{"host network", img("busybox", `,"extensions":{"docker.network":"host"}`), codeInvalidParameter, []string{"docker.network"}},
		{"cpu", `{"image":{"uri":"busybox"},"entrypoint":["x"],"resourceLimits":{"cpu":"1000"}}`, codeInvalidParameter, []string{"cpu", "1000 CPUs"}},
		{"memory", `{"image":{"uri":"busybox"},"entrypoint":["x"],"resourceLimits":{"memory":"10Ti"}}`, codeInvalidParameter, []string{"memory", "4Gi"}},
		{"gpu", `{"image":{"uri":"busybox"},"entrypoint":["x"],"resourceLimits":{"gpu":"1"}}`, codeInvalidParameter, []string{"gpu", "no GPU"}},
		{"mount at /proc", img("busybox", `,"volumes":[{"name":"v","mountPath":"/proc","pvc":{"claimName":"c"}}]`), codeVolumeMountPath, []string{"/proc"}},
		{"mount at execd", img("busybox", `,"volumes":[{"name":"v","mountPath":"/opt/opensandbox/bin","pvc":{"claimName":"c"}}]`), codeVolumeMountPath, []string{"execd"}},
		{"big env", img("busybox", `,"env":{"BIG":"`+strings.Repeat("x", 200<<10)+`"}`), codeInvalidParameter, []string{"BIG", "MAX_ARG_STRLEN"}},
		{"loopback registry", img("127.0.0.1:5000/x", ""), codeInvalidParameter, []string{"127.0.0.1", "loopback", "allow_local_registries"}},
		{"metadata registry", img("169.254.169.254/x", ""), codeInvalidParameter, []string{"169.254.169.254", "link-local"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.call("POST", "/v1/sandboxes", tt.body).wantStatus(t, http.StatusBadRequest)
			var env struct{ Code, Message string }
			r.decode(t, &env)
			if env.Code != tt.code {
				t.Fatalf("code %q, want %q: %s", env.Code, tt.code, env.Message)
			}
			for _, w := range tt.words {
				if !strings.Contains(env.Message, w) {
					t.Fatalf("message %q does not say %q", env.Message, w)
				}
			}
		})
	}
	if all, _ := rt.List(context.Background()); len(all) != 0 {
		t.Fatalf("refused creates reached the runtime: %d sandboxes", len(all))
	}

	// What fits, the runtime's own key, and the operator's options pass.
	e.call("POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["x"],"resourceLimits":{"cpu":"2","memory":"4Gi"},"extensions":{"docker.runtime":"runsc"}}`).wantStatus(t, http.StatusAccepted)
	open := newEnvWith(t, rt, func(c *Config) {
		c.AllowLocalRegistries = true
		c.AllowedExtensions = []string{"docker.privileged"}
	})
	open.call("POST", "/v1/sandboxes", img("127.0.0.1:5000/x", `,"extensions":{"docker.privileged":"true"}`)).wantStatus(t, http.StatusAccepted)
	open.call("POST", "/v1/sandboxes", img("[::1]:5000/x", "")).wantStatus(t, http.StatusAccepted)

	// A runtime that cannot tell its size is not second-guessed.
	rt.sizeErr = errors.New("engine unreachable")
	e.call("POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["x"],"resourceLimits":{"cpu":"1000"}}`).wantStatus(t, http.StatusAccepted)
}

func TestPoolRefusals(t *testing.T) {
	rt := &sizedRuntime{Runtime: fake.New(), size: sandbox.HostSize{CPUMillis: 2000, MemoryBytes: 4 << 30, GPUsKnown: true}}
	pools := &sizedPools{sizedRuntime: rt}
	e := newEnvWith(t, pools)
	body := func(uri, limits string) string {
		return `{"name":"p","template":{"image":{"uri":"` + uri + `"},"resourceLimits":{` + limits + `}},"capacitySpec":{"bufferMin":0,"bufferMax":0,"poolMin":0,"poolMax":1}}`
	}
	r := e.call("POST", "/v1/pools", body("127.0.0.1:5000/x", "")).wantStatus(t, http.StatusBadRequest)
	if !strings.Contains(string(r.body), "loopback") {
		t.Fatalf("local registry in a pool: %s", r.body)
	}
	r = e.call("POST", "/v1/pools", body("busybox", `"cpu":"64"`)).wantStatus(t, http.StatusBadRequest)
	if !strings.Contains(string(r.body), "64 CPUs") {
		t.Fatalf("oversized pool: %s", r.body)
	}
	if pools.created != 0 {
		t.Fatalf("%d refused pools reached the runtime", pools.created)
	}
}

// sizedPools is a sizedRuntime with pools that only counts creates.
type sizedPools struct {
	*sizedRuntime
	created int
}

func (p *sizedPools) CreatePool(ctx context.Context, def sandbox.Pool) (*sandbox.PoolInfo, error) {
	p.created++
	return &sandbox.PoolInfo{Pool: def}, nil
}
func (p *sizedPools) GetPool(ctx context.Context, name string) (*sandbox.PoolInfo, error) {
	return nil, sandbox.ErrNotFound
}
func (p *sizedPools) ListPools(ctx context.Context) ([]*sandbox.PoolInfo, error) { return nil, nil }
func (p *sizedPools) UpdatePool(ctx context.Context, def sandbox.Pool) (*sandbox.PoolInfo, error) {
	return &sandbox.PoolInfo{Pool: def}, nil
}
func (p *sizedPools) DeletePool(ctx context.Context, name string) error { return nil }
func (p *sizedPools) Claim(ctx context.Context, pool string, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	return nil, sandbox.ErrPoolEmpty
}

func TestKeyRequired(t *testing.T) {
	withKey, err := New(NewManager(fake.New(), ManagerConfig{}), Config{APIKey: "k", Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	open, err := New(NewManager(fake.New(), ManagerConfig{}), Config{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if !withKey.KeyRequired() || open.KeyRequired() {
		t.Fatalf("KeyRequired: with a key (and insecure) %v, without %v; want true, false", withKey.KeyRequired(), open.KeyRequired())
	}
}
