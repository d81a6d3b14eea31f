package sdk

import (
	"context"
	"net/http"

	"github.com/opensandbox/opensandbox/api"
)

// EgressPolicy returns the sandbox's egress policy and how it is
// enforced. Only a sandbox created with a NetworkPolicy has an egress
// API; others answer with an error.
func (s *Sandbox) EgressPolicy(ctx context.Context) (*api.PolicyStatus, error) {
	tg, err := s.egressAPI(ctx)
	if err != nil {
		return nil, err
	}
	r := tg.req("get egress policy of sandbox "+s.ID, http.MethodGet, "/policy", nil)
	r.idempotent = true
	var out api.PolicyStatus
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PatchEgress merges rules into the policy: each rule replaces the rule
// for the same target and all of them take precedence over the rules
// already there, in the order given. The default action is unchanged.
func (s *Sandbox) PatchEgress(ctx context.Context, rules ...api.NetworkRule) (*api.PolicyStatus, error) {
	return s.egressCall(ctx, "patch egress policy of sandbox "+s.ID, http.MethodPatch, rules)
}

// SetEgressPolicy replaces the whole policy.
func (s *Sandbox) SetEgressPolicy(ctx context.Context, p api.NetworkPolicy) (*api.PolicyStatus, error) {
	return s.egressCall(ctx, "set egress policy of sandbox "+s.ID, http.MethodPut, p)
}

// DeleteEgressRules removes the rules for these targets; unknown targets
// are ignored.
func (s *Sandbox) DeleteEgressRules(ctx context.Context, targets ...string) (*api.PolicyStatus, error) {
	return s.egressCall(ctx, "delete egress rules of sandbox "+s.ID, http.MethodDelete, targets)
}

func (s *Sandbox) egressCall(ctx context.Context, op, method string, body any) (*api.PolicyStatus, error) {
	tg, err := s.egressAPI(ctx)
	if err != nil {
		return nil, err
	}
	r, err := tg.jsonReq(op, method, "/policy", nil, body)
	if err != nil {
		return nil, err
	}
	r.idempotent = true // each of these sets a state; repeating it changes nothing
	var out api.PolicyStatus
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
