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
	var out api.PolicyStatus
	err := s.egressDo(ctx, egressCall{op: "get egress policy of sandbox " + s.ID, method: http.MethodGet, path: "/policy", idempotent: true}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// PatchEgress merges rules into the policy: each rule replaces the rule
// for the same target and all of them take precedence over the rules
// already there, in the order given. The default action is unchanged.
func (s *Sandbox) PatchEgress(ctx context.Context, rules ...api.NetworkRule) (*api.PolicyStatus, error) {
	return s.policyCall(ctx, "patch egress policy of sandbox "+s.ID, http.MethodPatch, rules)
}

// SetEgressPolicy replaces the whole policy.
func (s *Sandbox) SetEgressPolicy(ctx context.Context, p api.NetworkPolicy) (*api.PolicyStatus, error) {
	return s.policyCall(ctx, "set egress policy of sandbox "+s.ID, http.MethodPut, p)
}

// DeleteEgressRules removes the rules for these targets; unknown targets
// are ignored.
func (s *Sandbox) DeleteEgressRules(ctx context.Context, targets ...string) (*api.PolicyStatus, error) {
	return s.policyCall(ctx, "delete egress rules of sandbox "+s.ID, http.MethodDelete, targets)
}

// policyCall changes the policy. Each of these calls sets a state, so
// repeating it changes nothing: they are retried.
func (s *Sandbox) policyCall(ctx context.Context, op, method string, body any) (*api.PolicyStatus, error) {
	var out api.PolicyStatus
	if err := s.egressDo(ctx, egressCall{op: op, method: method, path: "/policy", body: body, idempotent: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// egressCall is one call to a sandbox's egress API.
type egressCall struct {
	op, method, path string
	// body is sent as JSON when not nil.
	body       any
	idempotent bool
	// vault calls classify their error answers with the vault's kinds:
	// notFound and conflict say what a 404 and a 409 mean for the call.
	vault              bool
	notFound, conflict error
}

// egressDo makes call on the sandbox's egress API, reached through the
// endpoint of PortEgress with its headers, and decodes the answer into
// out (nil to discard it).
func (s *Sandbox) egressDo(ctx context.Context, call egressCall, out any) error {
	tg, err := s.egressAPI(ctx)
	if err != nil {
		return err
	}
	r := tg.req(call.op, call.method, call.path, nil)
	if call.body != nil {
		if r, err = tg.jsonReq(call.op, call.method, call.path, nil, call.body); err != nil {
			return err
		}
	}
	r.idempotent = call.idempotent
	if err := s.c.t.call(ctx, r, out); err != nil {
		return call.classify(err)
	}
	return nil
}

// classify marks an error answer with ErrNoEgress or, for a vault call,
// the vault's kind of its status. Only the egress API's own answers,
// plain text without an error code, get a vault kind: a 404 with a code
// comes from a server on the way (a sandbox the lifecycle server's
// proxy does not know), not from the vault.
func (call egressCall) classify(err error) error {
	if err = noEgress(err); !call.vault {
		return err
	}
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "" || errors.Is(err, ErrNoEgress) {
		return err
	}
	if kind := vaultKind(ae.StatusCode, call.notFound, call.conflict); kind != nil {
		return &vaultError{kind: kind, ae: ae}
	}
	return err
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
