package ingress

import (
	"context"
	"errors"

	"github.com/opensandbox/opensandbox/api"
)

// Resolver tells the gateway where a sandbox's port is: the lifecycle
// server (Docker, one-machine setups) or the cluster's pods (Kubernetes).
type Resolver interface {
	// Target answers ErrNotFound for a sandbox it does not know, and an
	// error of its own when it cannot find out.
	Target(ctx context.Context, sandboxID string, port int) (api.IngressTarget, error)
}

// Renewer asks for a renew-on-access of a sandbox that opted in. The
// gateway calls it at most once per sandbox per throttle period; the
// receiver must never shorten an expiry.
type Renewer interface {
	Renew(ctx context.Context, sandboxID string, port int) error
}

// ErrNotFound is a Resolver's answer for a sandbox it does not know.
var ErrNotFound = errors.New("no such sandbox")
