package mcp

import (
	"context"
	"fmt"
	"strings"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
)

// maxTargets bounds the targets of one egress tool call; the server has
// its own cap on the rules of a policy.
const maxTargets = 100

// EgressRule is one rule of a sandbox's egress policy.
type EgressRule struct {
	Action string `json:"action" jsonschema:"allow or deny"`
	Target string `json:"target" jsonschema:"a host name (pypi.org), a wildcard (*.pythonhosted.org: any subdomain, not the domain itself), an IP address or a CIDR range"`
}

// EgressOutput is a sandbox's egress policy: which hosts it may reach.
type EgressOutput struct {
	SandboxID       string       `json:"sandbox_id"`
	Mode            string       `json:"mode" jsonschema:"deny_all, allow_all or enforcing (there are rules)"`
	EnforcementMode string       `json:"enforcement_mode" jsonschema:"how the policy is enforced: strict, dns+nft or dns"`
	DefaultAction   string       `json:"default_action" jsonschema:"what happens to a host no rule matches: allow or deny"`
	Rules           []EgressRule `json:"rules" jsonschema:"the rules in order: the first one matching a host decides"`
	Note            string       `json:"note,omitempty" jsonschema:"what the egress API said about the change, such as no matching targets found"`
}

// egressInput names targets of a sandbox's egress policy.
type egressInput struct {
	SandboxArg
	Targets []string `json:"targets" jsonschema:"host names (pypi.org), wildcards (*.pythonhosted.org: any subdomain, not the domain itself), IP addresses or CIDR ranges"`
}

func (in egressInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	if len(in.Targets) == 0 {
		return argErrorf("targets is empty: give at least one host name, wildcard, IP address or CIDR range")
	}
	if len(in.Targets) > maxTargets {
		return argErrorf("%d targets: give at most %d per call", len(in.Targets), maxTargets)
	}
	for _, t := range in.Targets {
		if t := strings.TrimSpace(t); t == "" || strings.Contains(t, "://") || strings.ContainsAny(t, " \t\n") {
			return argErrorf("target %q is not a host name, wildcard, IP address or CIDR range (no scheme, path or spaces: pypi.org, *.pythonhosted.org, 10.0.0.0/8)", t)
		}
	}
	return nil
}

// trimmed is the targets without surrounding spaces.
func (in egressInput) trimmed() []string {
	out := make([]string, len(in.Targets))
	for i, t := range in.Targets {
		out[i] = strings.TrimSpace(t)
	}
	return out
}

func (s *Server) addEgressTools() {
	add(s, &gomcp.Tool{
		Name: "egress_get",
		Description: `Show which hosts a sandbox may reach: its egress (outbound network) policy.
A policy is a default action (allow or deny) and rules; the first rule matching a host decides. Only a sandbox created with allowed_hosts (or a server's default policy) has one; in others every egress tool fails.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Get egress policy", ReadOnlyHint: true},
	}, func(ctx context.Context, in SandboxArg) (*gomcp.CallToolResult, EgressOutput, error) {
		return s.egressPolicy(ctx, in.SandboxID, "")
	})

	add(s, &gomcp.Tool{
		Name: "egress_allow",
		Description: `Let a sandbox reach more hosts: adds an allow rule for each target, ahead of every existing rule (replacing any rule for the same target).
Targets are host names (pypi.org), wildcards (*.pythonhosted.org covers every subdomain but not pythonhosted.org itself: allow both if both are needed), IP addresses and CIDR ranges.
New connections follow the change at once. Returns the whole policy.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Allow hosts", DestructiveHint: ptr(false), IdempotentHint: true, OpenWorldHint: ptr(true)},
	}, func(ctx context.Context, in egressInput) (*gomcp.CallToolResult, EgressOutput, error) {
		return s.patchEgress(ctx, in, "allow")
	})

	add(s, &gomcp.Tool{
		Name: "egress_deny",
		Description: `Stop a sandbox reaching hosts: adds a deny rule for each target, ahead of every existing rule (replacing any rule for the same target).
Use it to carve exceptions out of a wildcard or an allow-by-default policy. New connections are refused at once; connections already open stay up. Returns the whole policy.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Deny hosts", DestructiveHint: ptr(false), IdempotentHint: true},
	}, func(ctx context.Context, in egressInput) (*gomcp.CallToolResult, EgressOutput, error) {
		return s.patchEgress(ctx, in, "deny")
	})

	add(s, &gomcp.Tool{
		Name: "egress_remove",
		Description: `Remove the rules for some targets from a sandbox's egress policy, whatever their action; hosts they matched then fall to later rules or the default action.
Targets are compared as written (in any case): removing pypi.org does not remove *.pypi.org. Targets without a rule are ignored. Returns the whole policy.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Remove egress rules", DestructiveHint: ptr(false), IdempotentHint: true},
	}, func(ctx context.Context, in egressInput) (*gomcp.CallToolResult, EgressOutput, error) {
		st, err := s.client.Sandbox(in.SandboxID).DeleteEgressRules(ctx, in.trimmed()...)
		if err != nil {
			return nil, EgressOutput{}, err
		}
		return s.egressPolicy(ctx, in.SandboxID, st.Reason)
	})
}

// patchEgress puts a rule with action for each target first.
func (s *Server) patchEgress(ctx context.Context, in egressInput, action string) (*gomcp.CallToolResult, EgressOutput, error) {
	targets := in.trimmed()
	rules := make([]api.NetworkRule, len(targets))
	for i, t := range targets {
		rules[i] = api.NetworkRule{Action: action, Target: t}
	}
	st, err := s.client.Sandbox(in.SandboxID).PatchEgress(ctx, rules...)
	if err != nil {
		return nil, EgressOutput{}, err
	}
	return s.egressPolicy(ctx, in.SandboxID, st.Reason)
}

// egressPolicy reads the policy of sandbox id and describes it; note is
// what the change before said, if anything.
func (s *Server) egressPolicy(ctx context.Context, id, note string) (*gomcp.CallToolResult, EgressOutput, error) {
	st, err := s.client.Sandbox(id).EgressPolicy(ctx)
	if err != nil {
		return nil, EgressOutput{}, err
	}
	out := EgressOutput{SandboxID: id, Mode: st.Mode, EnforcementMode: st.EnforcementMode, DefaultAction: "deny", Rules: []EgressRule{}, Note: note}
	if p := st.Policy; p != nil {
		out.DefaultAction = cmpOr(strings.ToLower(p.DefaultAction), out.DefaultAction)
		for _, r := range p.Egress {
			out.Rules = append(out.Rules, EgressRule{Action: r.Action, Target: r.Target})
		}
	}
	return text(egressText(out)), out, nil
}

// egressText is the policy as the model reads it.
func egressText(o EgressOutput) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s egress policy (%s, enforced in %s mode)\n", o.SandboxID, o.Mode, o.EnforcementMode)
	if o.Note != "" {
		fmt.Fprintf(&b, "note: %s\n", o.Note)
	}
	for i, r := range o.Rules {
		fmt.Fprintf(&b, "%d. %s %s\n", i+1, r.Action, r.Target)
	}
	verb := "denied"
	if o.DefaultAction == "allow" {
		verb = "allowed"
	}
	if len(o.Rules) == 0 {
		fmt.Fprintf(&b, "no rules: every host is %s\n", verb)
	} else {
		fmt.Fprintf(&b, "any other host: %s (the first matching rule decides)\n", verb)
	}
	return b.String()
}

// noEgressHint tells the model what to do about a sandbox without a
// policy.
const noEgressHint = "Its network is not restricted, so there is nothing to show or change. To restrict a sandbox, create a new one with sandbox_create and allowed_hosts."

// explainNoEgress is the message of an egress call on a sandbox without
// an egress API.
func explainNoEgress(err error, sandboxID string) string {
	return fmt.Sprintf("sandbox %s has no egress policy: it was created without allowed_hosts. %s (%v)", sandboxID, noEgressHint, err)
}
