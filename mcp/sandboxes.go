package mcp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// SandboxInfo is a sandbox as the tools describe it.
type SandboxInfo struct {
	SandboxID string            `json:"sandbox_id"`
	State     string            `json:"state" jsonschema:"Pending, Running, Pausing, Paused, Stopping, Terminated or Failed"`
	Reason    string            `json:"reason,omitempty"`
	Message   string            `json:"message,omitempty"`
	Image     string            `json:"image,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty" jsonschema:"when the sandbox is killed automatically; absent when it never expires"`
}

func sandboxInfo(sb *api.Sandbox) SandboxInfo {
	info := SandboxInfo{SandboxID: sb.ID, State: sb.Status.State, Reason: sb.Status.Reason, Message: sb.Status.Message,
		Metadata: sb.Metadata, CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt}
	if sb.Image != nil {
		info.Image = sb.Image.URI
	}
	if sb.SnapshotID != "" && info.Image == "" {
		info.Image = "snapshot " + sb.SnapshotID
	}
	return info
}

type createInput struct {
	Image           string            `json:"image,omitempty" jsonschema:"container image to start from, such as python:3.11 or ubuntu:24.04"`
	Pool            string            `json:"pool,omitempty" jsonschema:"name of a warm pool (see pool_list) to take a ready sandbox from: it runs at once, with the pool's image and resources unless others are given"`
	TimeoutSeconds  *int              `json:"timeout_seconds,omitempty" jsonschema:"lifetime in seconds: the sandbox is killed automatically after it unless renewed with sandbox_renew"`
	Env             map[string]string `json:"env,omitempty" jsonschema:"environment variables of every process in the sandbox"`
	Metadata        map[string]string `json:"metadata,omitempty" jsonschema:"labels to find the sandbox again with sandbox_list"`
	Entrypoint      []string          `json:"entrypoint,omitempty" jsonschema:"the sandbox's main process as argv; default: one that keeps the sandbox idle and alive"`
	CPU             string            `json:"cpu,omitempty" jsonschema:"CPU limit such as 500m or 2; default 1"`
	Memory          string            `json:"memory,omitempty" jsonschema:"memory limit such as 512Mi or 4Gi; default 2Gi"`
	AllowedHosts    []string          `json:"allowed_hosts,omitempty" jsonschema:"restrict the sandbox's outbound network to these hosts: names (pypi.org), wildcards (*.pythonhosted.org: subdomains only), IP addresses or CIDR ranges; every other host is denied. Default: no restriction. Change it later with egress_allow, egress_deny, egress_remove"`
	CredentialProxy bool              `json:"credential_proxy,omitempty" jsonschema:"give the sandbox a credential proxy, so that vault_attach can make its requests carry the operator's credentials (needs allowed_hosts; not with pool)"`
}

type listInput struct {
	States   []string          `json:"states,omitempty" jsonschema:"keep only sandboxes in these states"`
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"keep only sandboxes whose metadata has all these pairs"`
	Page     int               `json:"page,omitempty" jsonschema:"page number, from 1"`
	PageSize int               `json:"page_size,omitempty" jsonschema:"sandboxes per page, default 50"`
}

// ListOutput is one page of sandboxes.
type ListOutput struct {
	Sandboxes []SandboxInfo `json:"sandboxes"`
	Total     int           `json:"total"`
	Page      int           `json:"page"`
	HasMore   bool          `json:"has_more" jsonschema:"true when a next page exists"`
}

type renewInput struct {
	SandboxArg
	TimeoutSeconds int `json:"timeout_seconds" jsonschema:"new lifetime in seconds, counted from now"`
}

// RenewOutput is the new expiry of a sandbox.
type RenewOutput struct {
	SandboxID string    `json:"sandbox_id"`
	ExpiresAt time.Time `json:"expires_at"`
}

// DoneOutput confirms an action that returns nothing else.
type DoneOutput struct {
	Done    bool   `json:"done"`
	Message string `json:"message"`
}

func done(format string, args ...any) (*gomcp.CallToolResult, DoneOutput, error) {
	msg := fmt.Sprintf(format, args...)
	return text(msg), DoneOutput{Done: true, Message: msg}, nil
}

type endpointInput struct {
	SandboxArg
	Port int `json:"port" jsonschema:"TCP port a process inside the sandbox listens on"`
}

// EndpointOutput is where a port of a sandbox is reached.
type EndpointOutput struct {
	URL     string            `json:"url" jsonschema:"base URL of the port, reachable from the machine osb mcp runs on"`
	Headers map[string]string `json:"headers,omitempty" jsonschema:"headers every request to the URL must carry"`
}

type urlInput struct {
	SandboxArg
	Port           int `json:"port" jsonschema:"TCP port a process inside the sandbox listens on, such as a web app's"`
	ExpiresSeconds int `json:"expires_seconds,omitempty" jsonschema:"how long the link stays valid, in seconds; default 3600"`
}

// URLOutput is a signed link to a port of a sandbox.
type URLOutput struct {
	URL       string    `json:"url" jsonschema:"link to the port, with its authorization in it: show it to the user to open"`
	ExpiresAt time.Time `json:"expires_at" jsonschema:"when the link stops working"`
	// Headers are set when the gateway routes by header: the link then
	// needs them, and a browser cannot open it.
	Headers map[string]string `json:"headers,omitempty" jsonschema:"headers a request to the URL must carry; set only when the gateway routes by header, so that a browser cannot open the link"`
	Browser bool              `json:"browser" jsonschema:"whether a browser can open the link as it is"`
}

// Bounds of sandbox_url's expires_seconds.
const (
	defaultURLExpiry = time.Hour
	maxURLExpiry     = 7 * 24 * time.Hour
)

func (in urlInput) validate() error {
	if in.ExpiresSeconds < 0 || time.Duration(in.ExpiresSeconds)*time.Second > maxURLExpiry {
		return argErrorf("expires_seconds %d: want 60 to %d, or leave it out for an hour", in.ExpiresSeconds, int(maxURLExpiry.Seconds()))
	}
	return nil
}

func (in createInput) validate() error {
	if in.Pool != "" {
		if err := (poolArg{Pool: in.Pool}).validate(); err != nil {
			return err
		}
	}
	for k := range in.Env {
		if k == "" || strings.Contains(k, "=") {
			return argErrorf("env name %q: must be non-empty and without '='", k)
		}
	}
	if in.CredentialProxy && len(in.AllowedHosts) == 0 {
		return argErrorf("credential_proxy needs allowed_hosts: name the hosts the sandbox may reach, the hosts of the credentials included")
	}
	if in.CredentialProxy && in.Pool != "" {
		return argErrorf("credential_proxy cannot be used with a pool: create the sandbox from an image")
	}
	if in.AllowedHosts != nil {
		if len(in.AllowedHosts) == 0 {
			return argErrorf("allowed_hosts is empty: leave it out for an unrestricted sandbox, or name the hosts it may reach")
		}
		return egressInput{SandboxArg: SandboxArg{SandboxID: "new"}, Targets: in.AllowedHosts}.validate()
	}
	return nil
}

// requireID rejects a blank sandbox id, which the schema cannot.
func requireID(id string) error {
	switch strings.TrimSpace(id) {
	case "":
		return argErrorf("sandbox_id is empty; call sandbox_list to find it")
	case ".", "..":
		return argErrorf("sandbox_id %q is not a sandbox id; call sandbox_list to find it", id)
	}
	if strings.ContainsAny(id, "/?#") {
		return argErrorf("sandbox_id %q is not a sandbox id; call sandbox_list to find it", id)
	}
	return nil
}

func (a SandboxArg) validate() error { return requireID(a.SandboxID) }

func (s *Server) addSandboxTools() {
	imageDesc := "container image to start from, such as python:3.11 or ubuntu:24.04"
	if s.cfg.DefaultImage != "" {
		imageDesc += "; default " + s.cfg.DefaultImage + ", or with pool the pool's"
	} else {
		imageDesc += "; required unless pool is given (the pool's is the default then), as no default image is configured"
	}
	lifetime := s.cfg.DefaultTimeout
	lifetimeDesc := "lifetime in seconds: the sandbox is killed automatically after it unless renewed with sandbox_renew; default "
	switch {
	case lifetime == sdk.NoTimeout:
		lifetimeDesc += "none (the sandbox lives until sandbox_kill)"
	case lifetime == 0:
		lifetimeDesc += fmt.Sprint(int(sdk.DefaultTimeout.Seconds()))
	default:
		lifetimeDesc += fmt.Sprint(int(lifetime.Seconds()))
	}
	createBounds, renewBounds := s.lifetimeBounds()
	switch {
	case s.limits == nil:
		lifetimeDesc += ". The server did not say its bounds: a value it refuses comes back as an error naming them"
	case s.limits.NoExpiryAllowed:
		lifetimeDesc += ". 0: no expiry, the sandbox lives until sandbox_kill"
	}
	add(s, &gomcp.Tool{
		Name: "sandbox_create",
		Description: `Create a sandbox: an isolated Linux container from an image, with its own filesystem, processes and network.
Returns its sandbox_id, which every other tool takes. It waits until the sandbox runs (usually a second or two; longer the first time an image is used).
With "pool" (see pool_list) it takes a sandbox started ahead of time, which runs at once.
With "allowed_hosts" the sandbox reaches only those hosts (egress_get and the other egress tools show and change the list).
Kill it with sandbox_kill when done; it is killed automatically when its timeout passes.
For code_run, use an image with the code interpreter (such as opensandbox/code-interpreter).`,
		Annotations: &gomcp.ToolAnnotations{Title: "Create sandbox", DestructiveHint: ptr(false), OpenWorldHint: ptr(true)},
	}, s.createSandbox,
		func(p map[string]*jsonschema.Schema) {
			p["image"].Description = imageDesc
			p["timeout_seconds"].Description = lifetimeDesc
		},
		createBounds)

	add(s, &gomcp.Tool{
		Name:        "sandbox_list",
		Description: "List sandboxes, newest first, with their state, image and expiry. Use it to find a sandbox_id again or to see what is still running.",
		Annotations: &gomcp.ToolAnnotations{Title: "List sandboxes", ReadOnlyHint: true},
	}, s.listSandboxes,
		func(p map[string]*jsonschema.Schema) {
			p["states"].Items.Enum = []any{sdk.StatePending, sdk.StateRunning, sdk.StatePausing, sdk.StatePaused,
				sdk.StateStopping, sdk.StateTerminated, sdk.StateFailed}
		},
		between("page", 1, 1e6), between("page_size", 1, 200))

	add(s, &gomcp.Tool{
		Name:        "sandbox_get",
		Description: "Get one sandbox's state (Running, Paused, Failed with the reason...), image, metadata and expiry.",
		Annotations: &gomcp.ToolAnnotations{Title: "Get sandbox", ReadOnlyHint: true},
	}, func(ctx context.Context, in SandboxArg) (*gomcp.CallToolResult, SandboxInfo, error) {
		return s.getInfo(ctx, in.SandboxID, "")
	})

	add(s, &gomcp.Tool{
		Name:        "sandbox_kill",
		Description: "Kill a sandbox: stop every process in it and delete it with its files. It cannot be undone. Kill sandboxes you no longer need.",
		Annotations: &gomcp.ToolAnnotations{Title: "Kill sandbox", DestructiveHint: ptr(true), IdempotentHint: true},
	}, func(ctx context.Context, in SandboxArg) (*gomcp.CallToolResult, DoneOutput, error) {
		if err := s.client.Kill(ctx, in.SandboxID); err != nil {
			return nil, DoneOutput{}, err
		}
		return done("sandbox %s killed", in.SandboxID)
	})

	add(s, &gomcp.Tool{
		Name:        "sandbox_renew",
		Description: "Extend a sandbox's life: it will now be killed timeout_seconds from now instead of at its current expiry. Use it before long work in a sandbox that expires soon.",
		Annotations: &gomcp.ToolAnnotations{Title: "Renew sandbox", DestructiveHint: ptr(false), IdempotentHint: true},
	}, func(ctx context.Context, in renewInput) (*gomcp.CallToolResult, RenewOutput, error) {
		at, err := s.client.Renew(ctx, in.SandboxID, time.Duration(in.TimeoutSeconds)*time.Second)
		if err != nil {
			return nil, RenewOutput{}, err
		}
		out := RenewOutput{SandboxID: in.SandboxID, ExpiresAt: at}
		return text(fmt.Sprintf("sandbox %s renewed: %s", in.SandboxID, expiryText(&at, time.Now()))), out, nil
	}, renewBounds)

	add(s, &gomcp.Tool{
		Name:        "sandbox_pause",
		Description: "Pause a running sandbox: its processes are frozen with their memory and nothing runs until sandbox_resume. Other tools fail on a paused sandbox.",
		Annotations: &gomcp.ToolAnnotations{Title: "Pause sandbox", DestructiveHint: ptr(false), IdempotentHint: true},
	}, func(ctx context.Context, in SandboxArg) (*gomcp.CallToolResult, SandboxInfo, error) {
		if err := s.client.Pause(ctx, in.SandboxID); err != nil {
			return nil, SandboxInfo{}, err
		}
		return s.getInfo(ctx, in.SandboxID, "paused: ")
	})

	add(s, &gomcp.Tool{
		Name:        "sandbox_resume",
		Description: "Resume a paused sandbox: its processes continue where they were. Returns once the sandbox answers again.",
		Annotations: &gomcp.ToolAnnotations{Title: "Resume sandbox", DestructiveHint: ptr(false), IdempotentHint: true},
	}, func(ctx context.Context, in SandboxArg) (*gomcp.CallToolResult, SandboxInfo, error) {
		if err := s.client.Sandbox(in.SandboxID).Resume(ctx); err != nil {
			return nil, SandboxInfo{}, err
		}
		return s.getInfo(ctx, in.SandboxID, "resumed: ")
	})

	add(s, &gomcp.Tool{
		Name: "sandbox_endpoint",
		Description: `Get the URL at which a TCP port inside the sandbox is reached, for a web server or API started in it (with command_start).
The URL is reachable from the machine osb mcp runs on; requests to it must carry the returned headers.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Get sandbox endpoint", ReadOnlyHint: true},
	}, func(ctx context.Context, in endpointInput) (*gomcp.CallToolResult, EndpointOutput, error) {
		u, h, err := s.client.EndpointURL(ctx, in.SandboxID, in.Port)
		if err != nil {
			return nil, EndpointOutput{}, err
		}
		out := EndpointOutput{URL: u}
		msg := fmt.Sprintf("port %d of sandbox %s is reached at %s", in.Port, in.SandboxID, u)
		if len(h) > 0 {
			out.Headers = map[string]string{}
			names := make([]string, 0, len(h))
			for k := range h {
				out.Headers[k] = h.Get(k)
				names = append(names, k)
			}
			slices.Sort(names)
			msg += "; every request must carry the headers " + strings.Join(names, ", ") + " (values in the structured result)"
		}
		return text(msg), out, nil
	}, between("port", 1, 65535))

	add(s, &gomcp.Tool{
		Name: "sandbox_url",
		Description: `Get a link to a TCP port inside the sandbox that a person can open, for a web app, notebook or desktop started in it (with command_start): show it to your user.
The link is signed: it carries its own authorization and stops working after expires_seconds. It needs the server's ingress gateway; without one, use sandbox_endpoint.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Get sandbox link", ReadOnlyHint: true, OpenWorldHint: ptr(true)},
	}, func(ctx context.Context, in urlInput) (*gomcp.CallToolResult, URLOutput, error) {
		d := defaultURLExpiry
		if in.ExpiresSeconds > 0 {
			d = time.Duration(in.ExpiresSeconds) * time.Second
		}
		until := time.Now().Add(d).Truncate(time.Second)
		ep, err := s.client.Endpoint(ctx, in.SandboxID, in.Port, sdk.WithExpiresAt(until))
		var ae *sdk.APIError
		if errors.As(err, &ae) && ae.Code == api.CodeSandboxAPINotSupported {
			return nil, URLOutput{}, withHint(err, "This server gives no signed links (it has no ingress gateway with signing keys): use sandbox_endpoint, whose URL needs headers.")
		}
		if err != nil {
			return nil, URLOutput{}, err
		}
		out := URLOutput{URL: ep.URL(s.client.Protocol()), ExpiresAt: until, Browser: true}
		msg := fmt.Sprintf("port %d of sandbox %s: %s (valid until %s, for %s)", in.Port, in.SandboxID, out.URL, until.UTC().Format(time.RFC3339), d)
		if route := ep.Headers[api.HeaderIngressTo]; route != "" {
			out.Headers, out.Browser = ep.Headers, false
			msg += "; the gateway routes by header, so a browser cannot open this link: every request must carry the header " +
				api.HeaderIngressTo + ": " + route
		}
		return text(msg), out, nil
	}, between("port", 1, 65535), between("expires_seconds", 60, maxURLExpiry.Seconds()), defaultValue("expires_seconds", "3600"))
}

// getInfo describes a sandbox in a line of prose after prefix, with the
// facts as structured content.
func (s *Server) getInfo(ctx context.Context, id, prefix string) (*gomcp.CallToolResult, SandboxInfo, error) {
	sb, err := s.client.Get(ctx, id)
	if err != nil {
		return nil, SandboxInfo{}, err
	}
	info := sandboxInfo(sb)
	return text(prefix + sandboxText(info, time.Now())), info, nil
}

// sandboxText is a sandbox as one line of prose: "sandbox sb-1: Running,
// image python:3.11, expires in 9m58s (at 2026-01-02T15:04:05Z)".
func sandboxText(info SandboxInfo, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s: %s", info.SandboxID, info.State)
	if info.State != sdk.StateRunning && (info.Reason != "" || info.Message != "") {
		fmt.Fprintf(&b, " (%s)", strings.TrimSpace(info.Reason+" "+info.Message))
	}
	if info.Image != "" {
		fmt.Fprintf(&b, ", image %s", info.Image)
	}
	if len(info.Metadata) > 0 {
		keys := slices.Sorted(maps.Keys(info.Metadata))
		pairs := make([]string, len(keys))
		for i, k := range keys {
			pairs[i] = k + "=" + info.Metadata[k]
		}
		fmt.Fprintf(&b, ", metadata %s", strings.Join(pairs, ","))
	}
	b.WriteString(", " + expiryText(info.ExpiresAt, now))
	return b.String()
}

// expiryText says when a sandbox expires, relative to now first: models
// reason better about "in 9m58s" than about a timestamp.
func expiryText(at *time.Time, now time.Time) string {
	if at == nil {
		return "never expires (lives until sandbox_kill)"
	}
	d := at.Sub(now).Round(time.Second)
	if d <= 0 {
		return fmt.Sprintf("expired %s ago (at %s)", -d, at.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("expires in %s (at %s)", d, at.UTC().Format(time.RFC3339))
}

// lifetimeBounds bound timeout_seconds of sandbox_create and of
// sandbox_renew by the server's limits, as GET /limits said them.
func (s *Server) lifetimeBounds() (create, renew schemaPatch) {
	return func(p map[string]*jsonschema.Schema) {
			lo := 1.0
			if s.limits != nil {
				lo = float64(s.limits.MinTimeoutSeconds)
				if s.limits.NoExpiryAllowed {
					lo = 0
				}
				if s.limits.MaxTimeoutSeconds != nil {
					hi := float64(*s.limits.MaxTimeoutSeconds)
					p["timeout_seconds"].Maximum = &hi
				}
			}
			p["timeout_seconds"].Minimum = &lo
		}, func(p map[string]*jsonschema.Schema) {
			lo := 1.0
			p["timeout_seconds"].Minimum = &lo
			if s.limits != nil && s.limits.MaxTimeoutSeconds != nil {
				hi := float64(*s.limits.MaxTimeoutSeconds)
				p["timeout_seconds"].Maximum = &hi
			}
		}
}

func (s *Server) createSandbox(ctx context.Context, in createInput) (*gomcp.CallToolResult, SandboxInfo, error) {
	opts := sdk.CreateOptions{
		Image:      in.Image,
		Pool:       in.Pool,
		Env:        in.Env,
		Metadata:   in.Metadata,
		Entrypoint: in.Entrypoint,
		Timeout:    s.cfg.DefaultTimeout,
	}
	from := "pool " + in.Pool
	if in.Pool == "" {
		// A pool's template gives the image; otherwise the default does.
		opts.Image = cmpOr(in.Image, s.cfg.DefaultImage)
		if opts.Image == "" {
			return nil, SandboxInfo{}, argErrorf("image is required (no default image is configured): pass one such as \"python:3.11\", or a pool from pool_list")
		}
		from = "image " + opts.Image
	}
	switch {
	case in.TimeoutSeconds == nil:
	case *in.TimeoutSeconds == 0:
		opts.Timeout = sdk.NoTimeout
	default:
		opts.Timeout = time.Duration(*in.TimeoutSeconds) * time.Second
	}
	if len(in.AllowedHosts) > 0 {
		targets := egressInput{Targets: in.AllowedHosts}.trimmed()
		p := &api.NetworkPolicy{DefaultAction: "deny", Egress: make([]api.NetworkRule, len(targets))}
		for i, t := range targets {
			p.Egress[i] = api.NetworkRule{Action: "allow", Target: t}
		}
		opts.NetworkPolicy = p
		opts.CredentialProxy = in.CredentialProxy
	}
	if in.CPU != "" || in.Memory != "" {
		// A pooled create leaves out what it does not ask for: the
		// pool's template gives it.
		opts.Resources = map[string]string{}
		if in.Pool == "" {
			opts.Resources = maps.Clone(sdk.DefaultResources)
		}
		if in.CPU != "" {
			opts.Resources["cpu"] = in.CPU
		}
		if in.Memory != "" {
			opts.Resources["memory"] = in.Memory
		}
	}
	sb, err := s.client.Create(ctx, opts)
	var se *sdk.StateError
	if errors.As(err, &se) {
		// Create has removed it already.
		return nil, SandboxInfo{}, fmt.Errorf("the sandbox from %s did not start (%s) and was removed. Check the image name, or try another image", from, se)
	} else if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil, SandboxInfo{}, fmt.Errorf("the sandbox from %s was not ready in %v and was removed (%v). A large image can be slow the first time; try again", from, sdk.DefaultReadyTimeout, err)
	} else if err != nil {
		return nil, SandboxInfo{}, err
	}
	return s.getInfo(ctx, sb.ID, "created ")
}

func (s *Server) listSandboxes(ctx context.Context, in listInput) (*gomcp.CallToolResult, ListOutput, error) {
	size := in.PageSize
	if size == 0 {
		size = 50
	}
	page, err := s.client.List(ctx, sdk.ListOptions{States: in.States, Metadata: in.Metadata, Page: in.Page, PageSize: size})
	if err != nil {
		return nil, ListOutput{}, err
	}
	out := ListOutput{Sandboxes: make([]SandboxInfo, 0, len(page.Items)), Total: page.Pagination.TotalItems,
		Page: page.Pagination.Page, HasMore: page.Pagination.HasNextPage}
	var b strings.Builder
	now := time.Now()
	for _, sb := range page.Items {
		info := sandboxInfo(&sb)
		out.Sandboxes = append(out.Sandboxes, info)
		b.WriteString(sandboxText(info, now) + "\n")
	}
	if len(out.Sandboxes) == 0 {
		b.WriteString("no sandboxes match\n")
	}
	fmt.Fprintf(&b, "page %d: %d of %d sandboxes", out.Page, len(out.Sandboxes), out.Total)
	if out.HasMore {
		fmt.Fprintf(&b, "; more: call sandbox_list with page %d", out.Page+1)
	}
	return text(b.String()), out, nil
}
