package sdk

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/opensandbox/opensandbox/api"
)

// ErrNoEgress matches (errors.Is) the error of an egress call on a
// sandbox that has no egress API: one created without a NetworkPolicy,
// where nothing enforces a policy and nothing answers on PortEgress.
var ErrNoEgress = errors.New("the sandbox has no egress policy API (it was created without a networkPolicy)")

// EgressPolicy returns the sandbox's egress policy and how it is
// enforced. Only a sandbox created with a NetworkPolicy has an egress
// API; on others the error matches ErrNoEgress.
func (s *Sandbox) EgressPolicy(ctx context.Context) (*api.PolicyStatus, error) {
	tg, err := s.egressAPI(ctx)
	if err != nil {
		return nil, err
	}
	r := tg.req("get egress policy of sandbox "+s.ID, http.MethodGet, "/policy", nil)
	r.idempotent = true
	var out api.PolicyStatus
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, noEgress(err)
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
		return nil, noEgress(err)
	}
	return &out, nil
}

// noEgress recognizes the answer of a sandbox without an egress API. Its
// endpoint for PortEgress leads to execd's port proxy, which answers 502
// with a plain-text body, without an error code, when nothing listens on
// the port. osb-egress never answers 502, and the lifecycle server's own
// proxy route answers 502 with an error code when the egress container
// is down, so that case stays an ErrUnavailable.
func noEgress(err error) error {
	var ae *APIError
	if errors.As(err, &ae) && ae.StatusCode == http.StatusBadGateway && ae.Code == "" {
		return &noEgressError{ae}
	}
	return err
}

// noEgressError is the error of an egress call on a sandbox without an
// egress API. It matches ErrNoEgress and is the *APIError it came from.
type noEgressError struct{ ae *APIError }

func (e *noEgressError) Error() string {
	return fmt.Sprintf("%s: %v: nothing answers on port %d (HTTP %d)", e.ae.Op, ErrNoEgress, PortEgress, e.ae.StatusCode)
}

func (e *noEgressError) Unwrap() []error { return []error{ErrNoEgress, e.ae} }
