package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// egressDoc is the document of `osb egress get`: the policy and how it
// is enforced. Egress is never null.
type egressDoc struct {
	Mode            string     `json:"mode"`
	EnforcementMode string     `json:"enforcement_mode"`
	DefaultAction   string     `json:"default_action"`
	Egress          []ruleView `json:"egress"`
}

// ruleView is one egress rule.
type ruleView struct {
	Action string `json:"action"`
	Target string `json:"target"`
}

func viewRules(rules []api.NetworkRule) []ruleView {
	out := make([]ruleView, 0, len(rules))
	for _, r := range rules {
		out = append(out, ruleView{r.Action, r.Target})
	}
	return out
}

// rulesText writes rules on one line: "allow pypi.org, deny *.evil.com".
func rulesText(rules []ruleView) string {
	parts := make([]string, len(rules))
	for i, r := range rules {
		parts[i] = r.Action + " " + r.Target
	}
	return strings.Join(parts, ", ")
}

// egressCommand is `osb egress`.
func (a *app) egressCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "egress",
		Short: "Show and change a sandbox's egress (outbound network) policy",
		Long: `Show and change the egress policy of a sandbox: which hosts, IPs and
networks it may reach. A policy is a default action (allow or deny) and
an ordered list of rules; the first rule matching a target wins. Targets
are host names ("pypi.org"), wildcards ("*.pythonhosted.org", any
subdomain but not the domain itself), IPs and CIDRs.

The policy is served by the sandbox's egress enforcer (osb-egress) on
port 18080, which runs beside sandboxes created with
--network-policy-file. In a sandbox without one these commands fail.`,
	}
	cmd.AddCommand(a.egressGet(), a.egressPatch(), a.egressDelete(), a.egressSet())
	return cmd
}

// egressError makes the error of a sandbox without an egress API say how
// to get one; the SDK recognizes that case (sdk.ErrNoEgress).
func egressError(err error) error {
	if errors.Is(err, sdk.ErrNoEgress) {
		return fmt.Errorf("%w; create the sandbox with --network-policy-file to give it one", err)
	}
	return err
}

func (a *app) egressGet() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "get ID",
		Short: "Show a sandbox's egress policy",
		Long: `Show the egress policy of sandbox ID: its mode (deny_all, allow_all or
enforcing), how it is enforced (strict, dns+nft or dns), the default action and
the rules in order. A policy without a default action denies.`,
		Example: `  osb egress get sb-123
  osb egress get sb-123 -o json > policy.json   # osb egress set reads it back`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeSandboxIDs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			st, err := c.Sandbox(args[0]).EgressPolicy(cmd.Context())
			if err != nil {
				return egressError(err)
			}
			doc := egressDoc{Mode: st.Mode, EnforcementMode: st.EnforcementMode, DefaultAction: "deny", Egress: []ruleView{}}
			if st.Policy != nil {
				doc.DefaultAction = first(strings.ToLower(st.Policy.DefaultAction), doc.DefaultAction)
				doc.Egress = viewRules(st.Policy.Egress)
			}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				p.kv("Egress Policy", [][2]string{
					{"sandbox_id", args[0]},
					{"mode", doc.Mode},
					{"enforcement_mode", doc.EnforcementMode},
					{"default_action", doc.DefaultAction},
				})
				rows := make([][]string, len(doc.Egress))
				for i, r := range doc.Egress {
					rows[i] = []string{fmt.Sprint(i + 1), r.Action, r.Target}
				}
				fmt.Fprintln(p.out)
				p.table("Rules (the first match wins)", []string{"#", "ACTION", "TARGET"}, rows, "No rules: the default action applies to every target.", nil)
			})
		},
	}, formatTable, formatJSON, formatYAML)
}

// parseRule reads a --rule value: ACTION=TARGET, split at the first "=",
// the action allow or deny in any case, both trimmed.
func parseRule(cmd *cobra.Command, s string) (api.NetworkRule, error) {
	action, target, ok := strings.Cut(s, "=")
	action, target = strings.ToLower(strings.TrimSpace(action)), strings.TrimSpace(target)
	switch {
	case !ok || target == "":
		return api.NetworkRule{}, usagef(cmd, "invalid rule %q: use ACTION=TARGET, for example allow=pypi.org", s)
	case action != "allow" && action != "deny":
		return api.NetworkRule{}, usagef(cmd, "invalid rule action %q in %q: use allow or deny", action, s)
	}
	return api.NetworkRule{Action: action, Target: target}, nil
}

// egressPatchDoc is the document of `osb egress patch`.
type egressPatchDoc struct {
	SandboxID    string     `json:"sandbox_id"`
	PatchedRules []ruleView `json:"patched_rules"`
	Mode         string     `json:"mode"`
}

func (a *app) egressPatch() *cobra.Command {
	var rules []string
	cmd := formats(&cobra.Command{
		Use:   "patch ID --rule ACTION=TARGET...",
		Short: "Add or change egress rules, leaving the others",
		Long: `Merge rules into the egress policy of sandbox ID. Each rule replaces the
rule for the same target, and the patched rules come first, in the order
given, before the rules already there; the default action is unchanged.
ACTION is allow or deny.`,
		Example: `  osb egress patch sb-123 --rule allow=pypi.org --rule allow=*.pythonhosted.org
  osb egress patch sb-123 --rule deny=10.0.0.0/8`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeSandboxIDs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if len(rules) == 0 {
				return usagef(cmd, "at least one --rule ACTION=TARGET is required")
			}
			parsed := make([]api.NetworkRule, 0, len(rules))
			for _, s := range rules {
				r, err := parseRule(cmd, s)
				if err != nil {
					return err
				}
				parsed = append(parsed, r)
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			st, err := c.Sandbox(args[0]).PatchEgress(cmd.Context(), parsed...)
			if err != nil {
				return egressError(err)
			}
			doc := egressPatchDoc{SandboxID: args[0], PatchedRules: viewRules(parsed), Mode: st.Mode}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				p.kv("Egress Policy Patched", [][2]string{
					{"sandbox_id", doc.SandboxID},
					{"patched_rules", rulesText(doc.PatchedRules)},
					{"mode", doc.Mode},
				})
			})
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().StringArrayVar(&rules, "rule", nil, "a rule ACTION=TARGET, such as allow=pypi.org (required; repeatable)")
	return cmd
}

// egressDeleteDoc is the document of `osb egress delete`.
type egressDeleteDoc struct {
	SandboxID string   `json:"sandbox_id"`
	Targets   []string `json:"deleted_targets"`
	Mode      string   `json:"mode"`
	// Reason is the egress API's note, such as "no matching targets
	// found"; null when it gave none.
	Reason *string `json:"reason"`
}

func (a *app) egressDelete() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "delete ID TARGET...",
		Short: "Remove the egress rules for some targets",
		Long: `Remove every rule of sandbox ID's egress policy whose target is one of
TARGET (in any case). Targets without a rule are ignored, so deleting twice
succeeds twice.`,
		Example:           `  osb egress delete sb-123 pypi.org '*.pythonhosted.org'`,
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: a.completeSandboxIDs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			targets := make([]string, 0, len(args)-1)
			for _, t := range args[1:] {
				if t = strings.TrimSpace(t); t == "" {
					return usagef(cmd, "empty TARGET")
				}
				targets = append(targets, t)
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			st, err := c.Sandbox(args[0]).DeleteEgressRules(cmd.Context(), targets...)
			if err != nil {
				return egressError(err)
			}
			doc := egressDeleteDoc{SandboxID: args[0], Targets: targets, Mode: st.Mode, Reason: optional(st.Reason)}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				pairs := [][2]string{{"sandbox_id", doc.SandboxID}, {"deleted_targets", strings.Join(targets, ", ")}, {"mode", doc.Mode}}
				if st.Reason != "" {
					pairs = append(pairs, [2]string{"reason", st.Reason})
				}
				p.kv("Egress Rules Deleted", pairs)
			})
		},
	}, formatTable, formatJSON, formatYAML)
}

// policyFile is the file `osb egress set` reads: the egress API's
// policy (defaultAction) or the document of `osb egress get -o json`
// (default_action; its mode fields are ignored).
type policyFile struct {
	DefaultAction      *string           `json:"defaultAction"`
	DefaultActionSnake *string           `json:"default_action"`
	Egress             []api.NetworkRule `json:"egress"`
	Mode               string            `json:"mode"`
	EnforcementMode    string            `json:"enforcement_mode"`
}

// readPolicy reads and checks a policy file ("-" for stdin): JSON, no
// unknown keys, actions allow or deny (any case), no empty target. A
// missing default action is deny.
func (a *app) readPolicy(path string) (api.NetworkPolicy, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(a.In)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return api.NetworkPolicy{}, fmt.Errorf("read policy: %w", err)
	}
	name := path
	if path == "-" {
		name = "stdin"
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var pf policyFile
	if err := dec.Decode(&pf); err != nil {
		return api.NetworkPolicy{}, fmt.Errorf("%s: invalid policy JSON: %v", name, err)
	}
	if pf.DefaultAction != nil && pf.DefaultActionSnake != nil {
		return api.NetworkPolicy{}, fmt.Errorf("%s: give defaultAction or default_action, not both", name)
	}
	def := "deny"
	if v := cmpPtr(pf.DefaultAction, pf.DefaultActionSnake); v != nil && strings.TrimSpace(*v) != "" {
		def = strings.ToLower(strings.TrimSpace(*v))
	}
	if def != "allow" && def != "deny" {
		return api.NetworkPolicy{}, fmt.Errorf("%s: default action %q: want allow or deny", name, def)
	}
	pol := api.NetworkPolicy{DefaultAction: def, Egress: make([]api.NetworkRule, 0, len(pf.Egress))}
	for i, r := range pf.Egress {
		r.Action, r.Target = strings.ToLower(strings.TrimSpace(r.Action)), strings.TrimSpace(r.Target)
		if r.Action != "allow" && r.Action != "deny" {
			return api.NetworkPolicy{}, fmt.Errorf("%s: egress[%d]: action %q: want allow or deny", name, i, r.Action)
		}
		if r.Target == "" {
			return api.NetworkPolicy{}, fmt.Errorf("%s: egress[%d]: empty target", name, i)
		}
		pol.Egress = append(pol.Egress, r)
	}
	return pol, nil
}

// cmpPtr returns the first non-nil pointer.
func cmpPtr[T any](ps ...*T) *T {
	for _, p := range ps {
		if p != nil {
			return p
		}
	}
	return nil
}

// egressSetDoc is the document of `osb egress set`.
type egressSetDoc struct {
	SandboxID     string     `json:"sandbox_id"`
	DefaultAction string     `json:"default_action"`
	Egress        []ruleView `json:"egress"`
	Mode          string     `json:"mode"`
}

func (a *app) egressSet() *cobra.Command {
	var file string
	cmd := formats(&cobra.Command{
		Use:   "set ID --file POLICY.json",
		Short: "Replace a sandbox's whole egress policy",
		Long: `Replace the egress policy of sandbox ID with the one in a JSON file ("-"
for stdin):

  {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}

default_action is accepted for defaultAction, so the output of
osb egress get -o json can be edited and set back. A missing default
action is deny; an empty file is refused.`,
		Example: `  osb egress set sb-123 --file policy.json
  osb egress get sb-123 -o json | jq '.default_action = "allow"' | osb egress set sb-123 --file -`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeSandboxIDs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if file == "" {
				return usagef(cmd, "--file is required")
			}
			pol, err := a.readPolicy(file)
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			st, err := c.Sandbox(args[0]).SetEgressPolicy(cmd.Context(), pol)
			if err != nil {
				return egressError(err)
			}
			doc := egressSetDoc{SandboxID: args[0], DefaultAction: pol.DefaultAction, Egress: viewRules(pol.Egress), Mode: st.Mode}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				p.kv("Egress Policy Set", [][2]string{
					{"sandbox_id", doc.SandboxID},
					{"default_action", doc.DefaultAction},
					{"egress", rulesText(doc.Egress)},
					{"mode", doc.Mode},
				})
			})
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().StringVarP(&file, "file", "f", "", `JSON file with the policy, "-" for stdin (required)`)
	return cmd
}
