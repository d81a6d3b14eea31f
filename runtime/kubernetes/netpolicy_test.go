package kubernetes

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files of testdata")

func policyFor(t *testing.T, cfg Config) *networkingv1.NetworkPolicy {
	t.Helper()
	cfg.LabelScope = "default"
	cfg.setNetworkDefaults()
	if err := cfg.validateNetwork(); err != nil {
		t.Fatal(err)
	}
	return egressPolicy(&cfg)
}

// TestEgressPolicy compares the default policy with
// testdata/egress-policy.yaml, and checks what it must say whatever the
// file says: sandbox pods of the scope only, egress only, everything but
// the blocked ranges, the cluster's DNS, the holes.
func TestEgressPolicy(t *testing.T) {
	p := policyFor(t, Config{})
	got, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "egress-policy.yaml")
	if *updateGolden {
		os.MkdirAll("testdata", 0o755)
		os.WriteFile(golden, got, 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("policy differs from %s (go test -run TestEgressPolicy -args -update rewrites it):\n%s", golden, got)
	}

	if sel := p.Spec.PodSelector.MatchLabels; sel[labelScope] != "default" || sel[labelKind] != kindSandbox || len(sel) != 2 {
		t.Errorf("pod selector %v", sel)
	}
	if !slices.Equal(p.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}) {
		t.Errorf("policy types %v: ingress must stay open for the server and clients", p.Spec.PolicyTypes)
	}
	anywhere := p.Spec.Egress[0]
	if len(anywhere.Ports) != 0 || len(anywhere.To) != 2 {
		t.Fatalf("first rule %+v", anywhere)
	}
	v4, v6 := anywhere.To[0].IPBlock, anywhere.To[1].IPBlock
	if v4.CIDR != "0.0.0.0/0" || !slices.Equal(v4.Except, []string{"169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"}) {
		t.Errorf("IPv4 block %+v", v4)
	}
	if v6.CIDR != "::/0" || !slices.Equal(v6.Except, []string{"fc00::/7", "fe80::/10"}) {
		t.Errorf("IPv6 block %+v", v6)
	}
	dns := p.Spec.Egress[1]
	if !equality.Semantic.DeepEqual(dns.To, []networkingv1.NetworkPolicyPeer{clusterDNS}) || len(dns.Ports) != 2 ||
		dns.Ports[0].Port.IntVal != 53 || dns.Ports[1].Port.IntVal != 53 || *dns.Ports[0].Protocol == *dns.Ports[1].Protocol {
		t.Errorf("DNS rule %+v", dns)
	}
	hole := p.Spec.Egress[2]
	if hole.To[0].IPBlock.CIDR != "169.254.20.10/32" || len(hole.Ports) != 2 || hole.Ports[0].Port.IntVal != 53 {
		t.Errorf("NodeLocal DNSCache rule %+v", hole)
	}
}

// TestEgressPolicyEmptied: with blocked_cidrs = [] the metadata services
// are still blocked; a hole without a port has no ports.
func TestEgressPolicyEmptied(t *testing.T) {
	p := policyFor(t, Config{BlockedCIDRs: []string{}, AllowedCIDRs: []string{"10.1.2.0/24"}})
	if got := p.Spec.Egress[0].To[0].IPBlock.Except; !slices.Equal(got, []string{"169.254.0.0/16", "100.100.100.200/32"}) {
		t.Errorf("IPv4 except %v", got)
	}
	if got := p.Spec.Egress[0].To[1].IPBlock.Except; !slices.Equal(got, []string{"fd00:ec2::254/128"}) {
		t.Errorf("IPv6 except %v", got)
	}
	if hole := p.Spec.Egress[2]; hole.To[0].IPBlock.CIDR != "10.1.2.0/24" || hole.Ports != nil || len(p.Spec.Egress) != 3 {
		t.Errorf("rules %+v", p.Spec.Egress)
	}
	cfg := Config{AllowedCIDRs: []string{"10.1.2.3/8"}}
	cfg.setNetworkDefaults()
	if err := cfg.validateNetwork(); err == nil || !strings.Contains(err.Error(), "runtime.kubernetes.allowed_cidrs") {
		t.Errorf("a range with host bits: %v", err)
	}
}

// TestNetworkPolicy: against the test cluster, a runtime makes its
// scope's policy, which the API server accepts as built; a start with
// other settings updates it; network_policy = false removes it.
func TestNetworkPolicy(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	api := e.cs.NetworkingV1().NetworkPolicies(e.ns)
	scope := "np-" + randomSuffix()
	cfg := e.config(scope)
	rt := e.runtime(t, cfg)
	got, err := api.Get(ctx, policyName(scope), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got.Spec, egressPolicy(&rt.cfg).Spec) {
		t.Fatalf("stored policy %+v\nwant %+v", got.Spec, egressPolicy(&rt.cfg).Spec)
	}
	rt.Close()

	cfg.AllowedCIDRs = []string{"10.1.2.3:5432"}
	rt = e.runtime(t, cfg)
	got, err = api.Get(ctx, policyName(scope), metav1.GetOptions{})
	if err != nil || len(got.Spec.Egress) != 3 || got.Spec.Egress[2].To[0].IPBlock.CIDR != "10.1.2.3/32" {
		t.Fatalf("policy after a change of allowed_cidrs: %+v, %v", got, err)
	}
	rt.Close()

	off := false
	cfg.NetworkPolicy = &off
	e.runtime(t, cfg)
	if _, err := api.Get(ctx, policyName(scope), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("network_policy = false left the policy: %v", err)
	}
}
