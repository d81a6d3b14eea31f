package kubernetes

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/opensandbox/opensandbox/sandbox"
)

// The runtime keeps one NetworkPolicy per label scope that limits what its
// sandbox pods may reach, as the Docker runtime's host firewall guard
// does: nothing in the blocked ranges (by default every private, shared
// and link-local range, and always the cloud metadata services), except
// the cluster's DNS on port 53 and the configured holes. Ingress is left
// alone: the server and clients reach execd with its token. Only network
// plugins that implement NetworkPolicy enforce it.

// kindNetworkPolicy labels the NetworkPolicy the runtime keeps.
const kindNetworkPolicy = "egress-policy"

// defaultAllowedCIDRs is the default of allowed_cidrs: NodeLocal
// DNSCache's well-known address, on the DNS port only.
var defaultAllowedCIDRs = []string{"169.254.20.10:53"}

// clusterDNS selects the cluster's DNS pods (CoreDNS keeps kube-dns's
// label).
var clusterDNS = networkingv1.NetworkPolicyPeer{
	NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
	PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
}

// policyName names the NetworkPolicy of a label scope.
func policyName(scope string) string { return "opensandbox-egress-" + scope }

// setNetworkDefaults fills in the network keys' defaults.
func (c *Config) setNetworkDefaults() {
	if c.NetworkPolicy == nil {
		t := true
		c.NetworkPolicy = &t
	}
	if c.BlockedCIDRs == nil { // absent; blocked_cidrs = [] blocks none of them
		c.BlockedCIDRs = slices.Clone(sandbox.DefaultBlockedCIDRs)
	}
	if c.AllowedCIDRs == nil {
		c.AllowedCIDRs = slices.Clone(defaultAllowedCIDRs)
	}
}

// validateNetwork checks the network keys and keeps what they say.
func (c *Config) validateNetwork() error {
	c.blocked, c.allowed = nil, nil
	for _, s := range slices.Concat(sandbox.MetadataCIDRs, c.BlockedCIDRs) {
		d, err := sandbox.ParseDestination(s, false)
		if err != nil {
			return fmt.Errorf("runtime.kubernetes.blocked_cidrs: %q: %w", s, err)
		}
		if !slices.Contains(c.blocked, d.Prefix) {
			c.blocked = append(c.blocked, d.Prefix)
		}
	}
	for _, s := range c.AllowedCIDRs {
		d, err := sandbox.ParseDestination(s, true)
		if err != nil {
			return fmt.Errorf("runtime.kubernetes.allowed_cidrs: %q: %w", s, err)
		}
		c.allowed = append(c.allowed, d)
	}
	return nil
}

// except returns the ranges of blocked in the family of all (0.0.0.0/0 or
// ::/0) that no other of them contains, as an ipBlock's except wants them.
func except(blocked []netip.Prefix, all netip.Prefix) []string {
	var out []string
	for _, b := range blocked {
		if b.Addr().Is4() != all.Addr().Is4() || b.Bits() == 0 {
			continue
		}
		inner := slices.ContainsFunc(blocked, func(o netip.Prefix) bool {
			return o != b && o.Bits() < b.Bits() && o.Contains(b.Addr())
		})
		if !inner {
			out = append(out, b.String())
		}
	}
	return out
}

// egressPolicy builds the NetworkPolicy of the runtime's sandbox pods.
func egressPolicy(cfg *Config) *networkingv1.NetworkPolicy {
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	port := func(p uint16) *intstr.IntOrString { v := intstr.FromInt32(int32(p)); return &v }
	dnsPorts := []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: port(53)}, {Protocol: &tcp, Port: port(53)}}
	var anywhere []networkingv1.NetworkPolicyPeer
	for _, all := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		anywhere = append(anywhere, networkingv1.NetworkPolicyPeer{
			IPBlock: &networkingv1.IPBlock{CIDR: all.String(), Except: except(cfg.blocked, all)},
		})
	}
	egress := []networkingv1.NetworkPolicyEgressRule{
		{To: anywhere},
		{To: []networkingv1.NetworkPolicyPeer{clusterDNS}, Ports: dnsPorts},
	}
	for _, d := range cfg.allowed {
		rule := networkingv1.NetworkPolicyEgressRule{
			To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: d.Prefix.String()}}},
		}
		if d.Port != 0 {
			rule.Ports = []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(d.Port)}, {Protocol: &udp, Port: port(d.Port)}}
		}
		egress = append(egress, rule)
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name:   policyName(cfg.LabelScope),
			Labels: map[string]string{labelScope: cfg.LabelScope, labelKind: kindNetworkPolicy},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{labelScope: cfg.LabelScope, labelKind: kindSandbox}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      egress,
		},
	}
}

// ensureNetworkPolicy makes the scope's NetworkPolicy what the
// configuration says: made or updated, or removed when network_policy is
// off. Every replica does it at start; replicas of one scope share one
// configuration.
func (r *Runtime) ensureNetworkPolicy(ctx context.Context) error {
	api := r.cs.NetworkingV1().NetworkPolicies(r.ns)
	want := egressPolicy(&r.cfg)
	have, err := api.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case !*r.cfg.NetworkPolicy:
		if err == nil {
			err = api.Delete(ctx, want.Name, metav1.DeleteOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove NetworkPolicy %s: %w", want.Name, err)
		}
		r.log.Warn("no NetworkPolicy for sandboxes (network_policy = false): they may reach the cluster, its nodes and the metadata services")
		return nil
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, want, metav1.CreateOptions{})
	case err != nil:
	case !equality.Semantic.DeepEqual(have.Spec, want.Spec) || !equality.Semantic.DeepEqual(have.Labels, want.Labels):
		have.Spec, have.Labels = want.Spec, want.Labels
		_, err = api.Update(ctx, have, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("NetworkPolicy %s in namespace %s (may this server manage networkpolicies there? network_policy = false runs without it): %w",
			want.Name, r.ns, err)
	}
	r.log.Info("sandbox egress NetworkPolicy", "name", want.Name, "blocked", r.cfg.blocked, "allowed", r.cfg.allowed)
	return nil
}
