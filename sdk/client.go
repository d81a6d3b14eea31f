package sdk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// Version is the version of this SDK, sent in the User-Agent.
const Version = "0.1.0"

// Sandbox states as the server reports them.
const (
	StatePending    = "Pending"
	StateRunning    = "Running"
	StatePausing    = "Pausing"
	StatePaused     = "Paused"
	StateStopping   = "Stopping"
	StateTerminated = "Terminated"
	StateFailed     = "Failed"
)

// Snapshot states.
const (
	SnapshotCreating = "Creating"
	SnapshotReady    = "Ready"
	SnapshotFailed   = "Failed"
	SnapshotDeleting = "Deleting"
)

// Client talks to one lifecycle server. It is safe for concurrent use
// and keeps connections alive between calls; Close releases them.
type Client struct {
	cfg    Config
	t      *transport
	server target
}

// NewClient returns a client for cfg. It does not contact the server.
func NewClient(cfg Config) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	base, _ := cfg.baseURL()
	hc := cfg.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		tr.MaxIdleConns = 256
		hc = &http.Client{Transport: tr}
	}
	timeout := cfg.RequestTimeout
	if timeout == 0 {
		timeout = DefaultRequestTimeout
	}
	retries := cfg.Retries
	if retries == 0 {
		retries = DefaultRetries
	}
	header := http.Header{}
	if cfg.APIKey != "" {
		header.Set(api.HeaderAPIKey, cfg.APIKey)
	}
	return &Client{
		cfg: cfg,
		t: &transport{hc: hc, timeout: timeout, retries: retries,
			userAgent: cmp.Or(cfg.UserAgent, "opensandbox-go/"+Version)},
		server: target{base: base.String(), header: header},
	}, nil
}

// NewClientFromEnv is NewClient(ConfigFromEnv()).
func NewClientFromEnv() (*Client, error) {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return NewClient(cfg)
}

// Close releases the client's idle connections. Calls made after Close
// open new ones.
func (c *Client) Close() {
	c.t.hc.CloseIdleConnections()
}

// BaseURL is the server's API root the client calls, ending in /v1.
func (c *Client) BaseURL() string { return c.server.base }

// Health asks the server's /health, which needs no API key.
func (c *Client) Health(ctx context.Context) (*api.Health, error) {
	r := c.server.req("check server health", http.MethodGet, "/health", nil)
	r.url = strings.TrimSuffix(c.server.base, "/v1") + "/health"
	r.idempotent = true
	var h api.Health
	if err := c.t.call(ctx, r, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Limits asks the server's GET /limits (an extension of this project's
// server) for the timeout bounds it enforces. A server without the route
// answers an *APIError with status 404.
func (c *Client) Limits(ctx context.Context) (*api.Limits, error) {
	r := c.server.req("read server limits", http.MethodGet, "/limits", nil)
	r.idempotent = true
	var l api.Limits
	if err := c.t.call(ctx, r, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// DefaultTimeout is the lifetime of a sandbox created without one, as in
// the other SDKs.
const DefaultTimeout = 10 * time.Minute

// NoTimeout as CreateOptions.Timeout creates a sandbox that lives until
// it is killed.
const NoTimeout time.Duration = -1

// DefaultEntrypoint is the entrypoint of a sandbox created without one,
// as in the other SDKs.
var DefaultEntrypoint = []string{"tail", "-f", "/dev/null"}

// DefaultResources are the limits of a sandbox created without any, as
// in the other SDKs.
var DefaultResources = map[string]string{"cpu": "1", "memory": "2Gi"}

// DefaultReadyTimeout bounds how long Create waits for a new sandbox.
const DefaultReadyTimeout = 60 * time.Second

// CreateOptions describes a sandbox to create. Image, SnapshotID or Pool
// is required.
type CreateOptions struct {
	// Image is the container image, local to the server's engine or
	// pulled from a registry, with ImageAuth for a private one.
	Image     string
	ImageAuth *api.ImageAuth
	// SnapshotID creates the sandbox from a snapshot instead of an image.
	SnapshotID string
	// Pool claims a ready sandbox of this warm pool (see Client.Pools):
	// Image, Entrypoint and Resources then default to the pool's template
	// instead of DefaultEntrypoint and DefaultResources. A create that
	// asks for what the pool's sandboxes are not (another image or
	// resources, volumes, a network policy...) is made cold from the
	// template, as is one that finds the pool empty. It cannot be
	// combined with SnapshotID or CredentialProxy.
	Pool string

	// Entrypoint is the command the sandbox runs, as argv; default
	// DefaultEntrypoint, which keeps the sandbox alive and does nothing.
	Entrypoint []string
	Env        map[string]string
	// Metadata labels the sandbox; List filters on it.
	Metadata map[string]string
	// Resources limits the sandbox: "cpu" ("500m", "2"), "memory"
	// ("512Mi", "2Gi"), "gpu". Default DefaultResources.
	Resources map[string]string

	// Timeout is the sandbox's lifetime: DefaultTimeout when zero,
	// unlimited with NoTimeout. The server rounds it to whole seconds.
	Timeout time.Duration

	Platform *api.PlatformSpec
	// NetworkPolicy restricts where the sandbox may connect; the sandbox
	// then has an egress API (Sandbox.EgressPolicy).
	NetworkPolicy *api.NetworkPolicy
	// CredentialProxy gives the sandbox a credential proxy, which puts
	// the secrets of its credential vault (Sandbox.Vault) into matching
	// outbound requests. It needs a NetworkPolicy, and a server that
	// offers it (one that does not refuses the create with ErrInvalid).
	CredentialProxy bool
	SecureAccess    bool
	Volumes         []api.Volume
	Extensions      map[string]string

	// SkipHealthCheck returns as soon as the server accepted the sandbox,
	// without waiting for it to run.
	SkipHealthCheck bool
	// ReadyTimeout bounds the wait for the sandbox to run and answer;
	// default DefaultReadyTimeout. A sandbox that is not ready in time is
	// killed and Create fails.
	ReadyTimeout time.Duration
}

// request is the wire form of the options.
func (o *CreateOptions) request() (*api.CreateSandboxRequest, error) {
	req := &api.CreateSandboxRequest{
		SnapshotID:     o.SnapshotID,
		Entrypoint:     o.Entrypoint,
		ResourceLimits: o.Resources,
		Metadata:       o.Metadata,
		Platform:       o.Platform,
		SecureAccess:   o.SecureAccess,
		Volumes:        o.Volumes,
		Extensions:     o.Extensions,
	}
	switch {
	case o.Image != "" && o.SnapshotID != "":
		return nil, fmt.Errorf("create sandbox: give an image or a snapshot, not both")
	case o.Pool != "" && o.SnapshotID != "":
		return nil, fmt.Errorf("create sandbox: a sandbox from pool %s cannot be made from a snapshot", o.Pool)
	case o.Pool != "" && o.CredentialProxy:
		return nil, fmt.Errorf("create sandbox: a sandbox from pool %s cannot have the credential proxy", o.Pool)
	case o.CredentialProxy && o.NetworkPolicy == nil:
		return nil, fmt.Errorf("create sandbox: the credential proxy needs a network policy")
	case o.Image != "":
		req.Image = &api.ImageSpec{URI: o.Image, Auth: o.ImageAuth}
	case o.SnapshotID == "" && o.Pool == "":
		return nil, fmt.Errorf("create sandbox: an image, a snapshot or a pool is required")
	}
	if o.Pool != "" {
		req.Extensions = maps.Clone(o.Extensions)
		if req.Extensions == nil {
			req.Extensions = map[string]string{}
		}
		req.Extensions[ExtensionPoolRef] = o.Pool
	} else {
		if len(req.Entrypoint) == 0 {
			req.Entrypoint = DefaultEntrypoint
		}
		if len(req.ResourceLimits) == 0 {
			req.ResourceLimits = DefaultResources
		}
	}
	switch {
	case o.Timeout == NoTimeout:
	case o.Timeout < 0:
		return nil, fmt.Errorf("create sandbox: negative timeout %v (use NoTimeout for none)", o.Timeout)
	default:
		secs := int64((cmp.Or(o.Timeout, DefaultTimeout) + time.Second - 1) / time.Second)
		req.Timeout = &secs
	}
	if len(o.Env) > 0 {
		req.Env = make(map[string]*string, len(o.Env))
		for k, v := range o.Env {
			req.Env[k] = &v
		}
	}
	if o.NetworkPolicy != nil {
		b, err := jsonRaw(o.NetworkPolicy)
		if err != nil {
			return nil, err
		}
		req.NetworkPolicy = b
	}
	if o.CredentialProxy {
		req.CredentialProxy = &api.CredentialProxy{Enabled: true}
	}
	return req, nil
}

// Create creates a sandbox and, unless SkipHealthCheck, waits until it
// runs and its execd answers. If the wait fails, the sandbox is killed
// and the error says what state it reached and why.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Sandbox, error) {
	body, err := opts.request()
	if err != nil {
		return nil, err
	}
	r, err := c.server.jsonReq("create sandbox", http.MethodPost, "/sandboxes", nil, body)
	if err != nil {
		return nil, err
	}
	var created api.CreateSandboxResponse
	if err := c.t.call(ctx, r, &created); err != nil {
		return nil, err
	}
	sb := c.Sandbox(created.ID)
	if opts.SkipHealthCheck {
		return sb, nil
	}
	if err := sb.WaitReady(ctx, cmp.Or(opts.ReadyTimeout, DefaultReadyTimeout)); err != nil {
		if kerr := sb.Kill(context.WithoutCancel(ctx)); kerr != nil && !errors.Is(kerr, ErrNotFound) {
			err = fmt.Errorf("%w (and killing it failed: %v)", err, kerr)
		}
		return nil, err
	}
	return sb, nil
}

// Sandbox returns a handle on the sandbox id without contacting the
// server; calls through it fail with ErrNotFound if there is no such
// sandbox.
func (c *Client) Sandbox(id string) *Sandbox {
	return &Sandbox{ID: id, c: c}
}

// Connect returns a handle on an existing sandbox after checking that it
// exists and resolving its execd endpoint. It does not wait for the
// sandbox to run; see Sandbox.WaitReady.
func (c *Client) Connect(ctx context.Context, id string) (*Sandbox, error) {
	sb := c.Sandbox(id)
	if _, err := sb.execd(ctx); err != nil {
		return nil, err
	}
	return sb, nil
}

// ListOptions filters and pages a list of sandboxes.
type ListOptions struct {
	// States keeps sandboxes in any of these states (Running, Paused...).
	States []string
	// Metadata keeps sandboxes whose metadata has all these pairs.
	Metadata map[string]string
	// Page is 1-based; PageSize at most 200. Zero values take the
	// server's defaults (1 and 20).
	Page, PageSize int
}

func (o ListOptions) query() url.Values {
	q := url.Values{}
	for _, s := range o.States {
		q.Add("state", s)
	}
	if len(o.Metadata) > 0 {
		m := url.Values{}
		for k, v := range o.Metadata {
			m.Set(k, v)
		}
		q.Set("metadata", m.Encode())
	}
	if o.Page > 0 {
		q.Set("page", strconv.Itoa(o.Page))
	}
	if o.PageSize > 0 {
		q.Set("pageSize", strconv.Itoa(o.PageSize))
	}
	return q
}

// List returns one page of sandboxes, newest first.
func (c *Client) List(ctx context.Context, opts ListOptions) (*api.ListSandboxesResponse, error) {
	r := c.server.req("list sandboxes", http.MethodGet, "/sandboxes", opts.query())
	r.idempotent = true
	var out api.ListSandboxesResponse
	if err := c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// All iterates over every sandbox matching opts, page after page from
// opts.Page (default 1). Iteration stops at the first error, which is
// yielded with a zero Sandbox.
func (c *Client) All(ctx context.Context, opts ListOptions) iter.Seq2[api.Sandbox, error] {
	return func(yield func(api.Sandbox, error) bool) {
		opts.Page = max(opts.Page, 1)
		opts.PageSize = cmp.Or(opts.PageSize, 100)
		for {
			page, err := c.List(ctx, opts)
			if err != nil {
				yield(api.Sandbox{}, err)
				return
			}
			for _, sb := range page.Items {
				if !yield(sb, nil) {
					return
				}
			}
			if !page.Pagination.HasNextPage || len(page.Items) == 0 {
				return
			}
			opts.Page++
		}
	}
}

// Get returns a sandbox's current description.
func (c *Client) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	r := c.server.req("get sandbox "+id, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil)
	r.idempotent = true
	var out api.Sandbox
	if err := c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Kill deletes a sandbox and everything in it.
func (c *Client) Kill(ctx context.Context, id string) error {
	r := c.server.req("kill sandbox "+id, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil)
	r.idempotent = true
	return c.t.call(ctx, r, nil)
}

// Pause freezes a running sandbox and returns once it is Paused; the
// processes inside keep their memory and continue on Resume.
func (c *Client) Pause(ctx context.Context, id string) error {
	r := c.server.req("pause sandbox "+id, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", nil)
	if err := c.t.call(ctx, r, nil); err != nil {
		return err
	}
	_, err := c.waitState(ctx, id, StatePaused)
	return err
}

// Resume thaws a paused sandbox and returns once it is Running.
func (c *Client) Resume(ctx context.Context, id string) error {
	r := c.server.req("resume sandbox "+id, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/resume", nil)
	if err := c.t.call(ctx, r, nil); err != nil {
		return err
	}
	_, err := c.waitState(ctx, id, StateRunning)
	return err
}

// waitState polls until the sandbox is in state want, and fails if it
// ends in Failed or Terminated instead.
func (c *Client) waitState(ctx context.Context, id, want string) (*api.Sandbox, error) {
	for delay := 20 * time.Millisecond; ; delay = min(delay*2, 500*time.Millisecond) {
		sb, err := c.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		switch sb.Status.State {
		case want:
			return sb, nil
		case StateFailed, StateTerminated:
			return nil, &StateError{ID: id, Want: want, Status: sb.Status}
		}
		if err := sleep(ctx, delay); err != nil {
			return nil, fmt.Errorf("wait for sandbox %s to be %s (now %s): %w", id, want, sb.Status.State, err)
		}
	}
}

// StateError says a sandbox ended in a state it will not leave while
// waiting for another.
type StateError struct {
	ID     string
	Want   string
	Status api.SandboxStatus
}

func (e *StateError) Error() string {
	msg := fmt.Sprintf("sandbox %s is %s, not %s", e.ID, e.Status.State, e.Want)
	if e.Status.Reason != "" {
		msg += ": " + e.Status.Reason
	}
	if e.Status.Message != "" {
		msg += ": " + e.Status.Message
	}
	return msg
}

// Renew sets a sandbox's expiry to now plus d and returns the new expiry
// as the server recorded it.
func (c *Client) Renew(ctx context.Context, id string, d time.Duration) (time.Time, error) {
	return c.RenewUntil(ctx, id, time.Now().Add(d))
}

// RenewUntil sets a sandbox's expiry to at. A sandbox created without a
// timeout cannot be renewed (ErrConflict).
func (c *Client) RenewUntil(ctx context.Context, id string, at time.Time) (time.Time, error) {
	r, err := c.server.jsonReq("renew sandbox "+id, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/renew-expiration", nil,
		api.RenewExpirationRequest{ExpiresAt: at.UTC()})
	if err != nil {
		return time.Time{}, err
	}
	r.idempotent = true // setting an absolute time twice is harmless
	var out api.RenewExpirationRequest
	if err := c.t.call(ctx, r, &out); err != nil {
		return time.Time{}, err
	}
	return out.ExpiresAt, nil
}

// PatchMetadata merges patch into a sandbox's metadata: a nil value
// deletes its key. It returns the sandbox as it is afterwards.
func (c *Client) PatchMetadata(ctx context.Context, id string, patch map[string]*string) (*api.Sandbox, error) {
	r, err := c.server.jsonReq("patch metadata of sandbox "+id, http.MethodPatch, "/sandboxes/"+url.PathEscape(id)+"/metadata", nil, patch)
	if err != nil {
		return nil, err
	}
	r.contentType = "application/merge-patch+json"
	r.idempotent = true
	var out api.Sandbox
	if err := c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// EndpointOption adjusts what Endpoint asks for.
type EndpointOption func(*endpointOptions)

type endpointOptions struct {
	expires time.Time
}

// WithExpiry asks for a signed endpoint valid for d from now: a route
// through the server's ingress gateway that carries its own
// authorization, so that its URL works without headers (in the gateway's
// uri and wildcard route modes a browser opens it). Servers without a
// gateway and signing keys refuse it (a 400 whose code is
// api.CodeSandboxAPINotSupported).
func WithExpiry(d time.Duration) EndpointOption {
	return func(o *endpointOptions) { o.expires = time.Now().Add(d) }
}

// WithExpiresAt is WithExpiry until t (whole seconds, rounded down).
func WithExpiresAt(t time.Time) EndpointOption {
	return func(o *endpointOptions) { o.expires = t }
}

// Endpoint returns where port of a sandbox is reached: a scheme-less
// host:port[/prefix] and the headers every request to it must carry.
// With Config.UseServerProxy the endpoint goes through the server, unless
// an option asks for a signed endpoint, which only the gateway gives.
func (c *Client) Endpoint(ctx context.Context, id string, port int, opts ...EndpointOption) (*api.Endpoint, error) {
	var o endpointOptions
	for _, opt := range opts {
		opt(&o)
	}
	q := url.Values{}
	what := fmt.Sprintf("get endpoint of sandbox %s port %d", id, port)
	if !o.expires.IsZero() {
		q.Set("expires", strconv.FormatInt(o.expires.Unix(), 10))
		what = fmt.Sprintf("get a signed endpoint of sandbox %s port %d", id, port)
	} else if c.cfg.UseServerProxy {
		q.Set("use_server_proxy", "true")
	}
	r := c.server.req(what, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/endpoints/"+strconv.Itoa(port), q)
	r.idempotent = true
	var out api.Endpoint
	if err := c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// EndpointURL is Endpoint as a URL with the client's protocol, and the
// headers to send.
func (c *Client) EndpointURL(ctx context.Context, id string, port int, opts ...EndpointOption) (string, http.Header, error) {
	ep, err := c.Endpoint(ctx, id, port, opts...)
	if err != nil {
		return "", nil, err
	}
	tg := c.endpointTarget(ep)
	return tg.base, tg.header, nil
}

// Protocol is the scheme of the server and of the sandboxes' endpoints:
// "http" or "https".
func (c *Client) Protocol() string { return c.cfg.protocol() }

// endpointTarget turns an endpoint into a request target.
func (c *Client) endpointTarget(ep *api.Endpoint) *target {
	h := http.Header{}
	for k, v := range ep.Headers {
		h.Set(k, v)
	}
	base := ep.Endpoint
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		base = c.cfg.protocol() + "://" + base
	}
	return &target{base: strings.TrimRight(base, "/"), header: h}
}

// Logs returns the sandbox's diagnostic logs for scope ("container",
// "all", or what the server offers).
func (c *Client) Logs(ctx context.Context, id, scope string) (*api.DiagnosticContent, error) {
	return c.diagnostics(ctx, id, "logs", scope)
}

// Events returns the sandbox's diagnostic events for scope ("runtime",
// "all", or what the server offers).
func (c *Client) Events(ctx context.Context, id, scope string) (*api.DiagnosticContent, error) {
	return c.diagnostics(ctx, id, "events", scope)
}

func (c *Client) diagnostics(ctx context.Context, id, kind, scope string) (*api.DiagnosticContent, error) {
	q := url.Values{"scope": {scope}}
	r := c.server.req(fmt.Sprintf("get %s of sandbox %s", kind, id), http.MethodGet,
		"/sandboxes/"+url.PathEscape(id)+"/diagnostics/"+kind, q)
	r.idempotent = true
	var out api.DiagnosticContent
	if err := c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
