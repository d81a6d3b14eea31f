package docker

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestEgressContainerConfig: osb-egress's container holds NET_ADMIN and
// nothing else, owns the published ports (the egress API's included) on
// the bind address, carries the policy and its token, has no IPv6 in
// strict mode, and is not taken for a sandbox.
func TestEgressContainerConfig(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		secure bool
	}{{sandbox.EgressStrict, false}, {sandbox.EgressDNSNft, true}} {
		cfg := configFor(t, "", func(c *Config) {
			c.Egress = sandbox.EgressConfig{Mode: tc.mode, DNSUpstreams: []string{"192.0.2.53"}, AlwaysDeny: []string{"10.0.0.0/8"}}
		})
		spec := &sandbox.Spec{NetworkPolicy: []byte(`{"defaultAction":"deny","egress":[]}`), SecureAccess: tc.secure}
		cc, hc := egressContainerConfig(cfg, "sbx-1", spec, "tok", nil)
		if !slices.Equal(hc.CapDrop, []string{"ALL"}) || !slices.Equal(hc.CapAdd, []string{"NET_ADMIN"}) || hc.Privileged ||
			!slices.Contains(hc.SecurityOpt, "no-new-privileges:true") {
			t.Errorf("%s: capabilities %v %v, privileged %v, security %v", tc.mode, hc.CapDrop, hc.CapAdd, hc.Privileged, hc.SecurityOpt)
		}
		if string(hc.NetworkMode) != cfg.Network || hc.PidMode != "" || hc.IpcMode != "" {
			t.Errorf("%s: network %q pid %q ipc %q", tc.mode, hc.NetworkMode, hc.PidMode, hc.IpcMode)
		}
		var ports []string
		for p, bs := range hc.PortBindings {
			ports = append(ports, string(p))
			if len(bs) != 1 || bs[0].HostIP != cfg.BindIP || bs[0].HostPort != "" {
				t.Errorf("%s: port %s bound %v", tc.mode, p, bs)
			}
		}
		slices.Sort(ports)
		execd := strconv.Itoa(api.ExecdPort) + "/tcp"
		want := []string{"18080/tcp", execd, "8080/tcp"}
		if tc.secure {
			want = []string{"18080/tcp", execd}
		}
		if !slices.Equal(ports, want) {
			t.Errorf("%s: published %v, want %v", tc.mode, ports, want)
		}
		v6off := hc.Sysctls["net.ipv6.conf.all.disable_ipv6"] == "1"
		if v6off != (tc.mode == sandbox.EgressStrict) {
			t.Errorf("%s: sysctls %v", tc.mode, hc.Sysctls)
		}
		env := strings.Join(cc.Env, "\n")
		for _, w := range []string{envEgressToken + "=tok", envEgressMode + "=" + tc.mode, envEgressRules + `={"defaultAction":"deny","egress":[]}`,
			envEgressUpstreams + "=192.0.2.53", envEgressAlwaysDeny + "=10.0.0.0/8", envEgressPolicyFile + "=" + egressPolicyFile} {
			if !strings.Contains(env, w) {
				t.Errorf("%s: env lacks %s:\n%s", tc.mode, w, env)
			}
		}
		if _, ok := cc.Labels[labelScope]; ok || cc.Labels[labelEgressOf] != "sbx-1" || cc.Labels[labelEgressScope] != cfg.LabelScope {
			t.Errorf("%s: labels %v", tc.mode, cc.Labels)
		}
		if hc.Memory == 0 || hc.PidsLimit == nil {
			t.Errorf("%s: unbounded: memory %d, pids %v", tc.mode, hc.Memory, hc.PidsLimit)
		}
	}
	for _, network := range []string{"host", "none", "container:x"} {
		if err := egressNetworkOK(network); err == nil {
			t.Errorf("network %q accepted for a policy", network)
		}
	}
	if err := egressNetworkOK("opensandbox"); err != nil {
		t.Error(err)
	}
}

// TestEgressRefusedOnGVisor: a policy on a runsc sandbox is a 400, not a
// sandbox whose traffic nobody checks.
func TestEgressRefusedOnGVisor(t *testing.T) {
	testenv.MustHaveDocker(t)
	rt := newTestRuntime(t, nil)
	_, err := rt.Create(context.Background(), "gvisor-policy", sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "60"},
		NetworkPolicy: []byte(`{"defaultAction":"deny","egress":[]}`), Extensions: map[string]string{extRuntime: "runsc"}})
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "runsc") {
		t.Fatalf("create: %v", err)
	}
}

// TestSweepEgress: an egress container whose sandbox the runtime does not
// know (a create or delete cut short by a crash) is removed when the
// runtime starts; one of another scope is left alone.
func TestSweepEgress(t *testing.T) {
	testenv.MustHaveDocker(t)
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	mine, theirs := "osb-test-sweep-"+testScope(), "osb-test-keep-"+testScope()
	for name, scope := range map[string]string{mine: rt.cfg.LabelScope, theirs: testScope()} {
		_, err := rt.eng.create(ctx, name, &container.Config{Image: testImage, Cmd: []string{"sleep", "600"},
			Labels: map[string]string{labelEgressOf: "gone", labelEgressScope: scope}}, &container.HostConfig{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { exec.Command("docker", "rm", "-f", name).Run() })
	}
	rt.sweepEgress(ctx)
	if _, err := rt.eng.inspect(ctx, mine); err == nil {
		t.Error("the orphaned egress container of this scope is still there")
	}
	if _, err := rt.eng.inspect(ctx, theirs); err != nil {
		t.Errorf("another scope's egress container was removed: %v", err)
	}
}
