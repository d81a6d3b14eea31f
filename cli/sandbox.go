package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// sandboxView is a sandbox as osb prints it: the snake_case field names
// of the other OpenSandbox CLIs.
type sandboxView struct {
	ID         string            `json:"id"`
	Status     statusView        `json:"status"`
	Entrypoint []string          `json:"entrypoint"`
	ExpiresAt  *time.Time        `json:"expires_at"`
	CreatedAt  time.Time         `json:"created_at"`
	Image      *imageView        `json:"image"`
	SnapshotID *string           `json:"snapshot_id"`
	Platform   *api.PlatformSpec `json:"platform"`
	Metadata   map[string]string `json:"metadata"`
}

type statusView struct {
	State            string     `json:"state"`
	Reason           *string    `json:"reason"`
	Message          *string    `json:"message"`
	LastTransitionAt *time.Time `json:"last_transition_at"`
}

type imageView struct {
	Image string    `json:"image"`
	Auth  *authView `json:"auth"`
}

// authView never shows the password.
type authView struct {
	Username string `json:"username"`
}

func viewSandbox(s *api.Sandbox) sandboxView {
	v := sandboxView{
		ID:         s.ID,
		Status:     statusView{State: s.Status.State, Reason: optional(s.Status.Reason), Message: optional(s.Status.Message), LastTransitionAt: s.Status.LastTransitionAt},
		Entrypoint: s.Entrypoint,
		ExpiresAt:  s.ExpiresAt,
		CreatedAt:  s.CreatedAt,
		SnapshotID: optional(s.SnapshotID),
		Platform:   s.Platform,
		Metadata:   s.Metadata,
	}
	if s.Image != nil {
		v.Image = &imageView{Image: s.Image.URI}
		if s.Image.Auth != nil {
			v.Image.Auth = &authView{Username: s.Image.Auth.Username}
		}
	}
	return v
}

func imageOf(s *api.Sandbox) string {
	if s.Image != nil {
		return s.Image.URI
	}
	if s.SnapshotID != "" {
		return "snapshot:" + s.SnapshotID
	}
	return ""
}

func timeText(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// validStates are the states a list can filter on.
var validStates = []string{sdk.StateFailed, sdk.StatePaused, sdk.StatePausing, sdk.StatePending, sdk.StateRunning, sdk.StateStopping, sdk.StateTerminated, "Unknown"}

func normalizeState(s string) (string, bool) {
	for _, v := range validStates {
		if strings.EqualFold(v, strings.TrimSpace(s)) {
			return v, true
		}
	}
	return "", false
}

// sandboxCommand is `osb sandbox`.
func (a *app) sandboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sb"},
		Short:   "Create, list, inspect and remove sandboxes",
	}
	cmd.AddCommand(a.sandboxCreate(), a.sandboxList(), a.sandboxGet(), a.sandboxKill(),
		a.sandboxPause(), a.sandboxResume(), a.sandboxRenew(), a.sandboxEndpoint(),
		a.sandboxHealth(), a.sandboxMetrics())
	// Tab completes the sandbox ids these commands take.
	for _, c := range cmd.Commands() {
		switch c.Name() {
		case "get", "pause", "resume", "renew", "endpoint", "health", "metrics":
			c.ValidArgsFunction = a.completeSandboxIDs
		case "kill":
			c.ValidArgsFunction = a.completeManySandboxIDs
		}
	}
	return cmd
}

// createDoc is the document of `osb sandbox create`.
type createDoc struct {
	ID         string     `json:"id"`
	Status     string     `json:"status"`
	Timeout    string     `json:"timeout"`
	Image      string     `json:"image,omitempty"`
	SnapshotID string     `json:"snapshot_id,omitempty"`
	Pool       string     `json:"pool,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at"`
}

// clockText writes a duration as H:MM:SS, or "N day(s), H:MM:SS".
func clockText(d time.Duration) string {
	secs := int64(d / time.Second)
	days := secs / 86400
	secs %= 86400
	s := fmt.Sprintf("%d:%02d:%02d", secs/3600, secs/60%60, secs%60)
	switch {
	case days == 1:
		s = "1 day, " + s
	case days > 1:
		s = fmt.Sprintf("%d days, %s", days, s)
	}
	return s
}

func (a *app) sandboxCreate() *cobra.Command {
	var (
		image, user, pass, snapshot, pool, timeout, policyFile, volumesFile string
		env, meta, ext, resources, entrypoint                               []string
		readyTimeout                                                        time.Duration
		skipHealth, credProxy, secure                                       bool
	)
	cmd := formats(&cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and wait until it runs",
		Example: `  osb sandbox create --image python:3.11 --timeout 30m -e DEBUG=1 -m team=ml
  osb sandbox create -i node:22 --resource cpu=2 --resource memory=4Gi --entrypoint node --entrypoint server.js
  osb sandbox create --snapshot-id snap-123 --timeout none
  osb sandbox create --pool py -e TASK=42`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			opts := sdk.CreateOptions{SnapshotID: snapshot, Pool: pool, Entrypoint: entrypoint, SkipHealthCheck: skipHealth,
				ReadyTimeout: readyTimeout, CredentialProxy: credProxy, SecureAccess: secure}
			switch {
			case snapshot != "" && image != "":
				return usagef(cmd, "--snapshot-id and --image cannot be used together")
			case snapshot != "" && pool != "":
				return usagef(cmd, "--snapshot-id and --pool cannot be used together")
			case pool != "" && credProxy:
				return usagef(cmd, "--pool cannot be combined with --credential-proxy")
			case snapshot != "" && (user != "" || pass != ""):
				return usagef(cmd, "--snapshot-id cannot be combined with image credentials")
			case (user == "") != (pass == ""):
				return usagef(cmd, "pass both --image-auth-username and --image-auth-password")
			case credProxy && policyFile == "":
				return usagef(cmd, "--credential-proxy requires --network-policy-file")
			}
			switch {
			case pool != "":
				opts.Image = image // the pool's template gives it otherwise
			case snapshot == "":
				opts.Image = first(image, a.set.DefaultImage)
				if opts.Image == "" {
					return fmt.Errorf("an image is required: pass --image or set defaults.image (osb config set defaults.image IMAGE)")
				}
			}
			if user != "" {
				opts.ImageAuth = &api.ImageAuth{Username: user, Password: pass}
			}
			lifetime := first(timeout, a.set.DefaultTimeout)
			timeoutText := "sdk-default"
			if lifetime != "" {
				d, none, err := parseLifetime(lifetime)
				if err != nil {
					return usagef(cmd, "--timeout: %v", err)
				}
				if none {
					opts.Timeout, timeoutText = sdk.NoTimeout, "manual-cleanup"
				} else {
					opts.Timeout, timeoutText = d, clockText(d)
				}
			}
			if opts.Env, err = parseKeyValues(cmd, "--env", env); err != nil {
				return err
			}
			if opts.Metadata, err = parseKeyValues(cmd, "--metadata", meta); err != nil {
				return err
			}
			if opts.Extensions, err = parseKeyValues(cmd, "--extension", ext); err != nil {
				return err
			}
			if opts.Resources, err = parseKeyValues(cmd, "--resource", resources); err != nil {
				return err
			}
			if policyFile != "" {
				var p api.NetworkPolicy
				if err := readJSONFile(policyFile, &p); err != nil {
					return err
				}
				opts.NetworkPolicy = &p
			}
			if volumesFile != "" {
				if err := readJSONFile(volumesFile, &opts.Volumes); err != nil {
					return err
				}
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			sb, err := c.Create(cmd.Context(), opts)
			if err != nil {
				return err
			}
			doc := createDoc{ID: sb.ID, Status: "created", Timeout: timeoutText, Image: opts.Image, SnapshotID: snapshot, Pool: pool}
			if info, err := sb.Info(cmd.Context()); err == nil {
				doc.ExpiresAt = info.ExpiresAt
				if pool != "" && doc.Image == "" && info.Image != nil {
					doc.Image = info.Image.URI // the pool's
				}
				if !skipHealth {
					doc.Status = strings.ToLower(info.Status.State)
				}
			}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				pairs := [][2]string{{"id", doc.ID}, {"status", doc.Status}, {"timeout", doc.Timeout}}
				if doc.Image != "" {
					pairs = append(pairs, [2]string{"image", doc.Image})
				}
				if doc.SnapshotID != "" {
					pairs = append(pairs, [2]string{"snapshot_id", doc.SnapshotID})
				}
				if doc.Pool != "" {
					pairs = append(pairs, [2]string{"pool", doc.Pool})
				}
				pairs = append(pairs, [2]string{"expires_at", timeText(doc.ExpiresAt)})
				p.kv("Sandbox Created", pairs)
			})
		},
	}, formatTable, formatJSON, formatYAML)
	fl := cmd.Flags()
	fl.StringVarP(&image, "image", "i", "", "container image (default: defaults.image of the config)")
	fl.StringVar(&user, "image-auth-username", "", "registry user for a private image")
	fl.StringVar(&pass, "image-auth-password", "", "registry password or token")
	fl.StringVar(&snapshot, "snapshot-id", "", "create from a snapshot instead of an image")
	fl.StringVar(&pool, "pool", "", "take a ready sandbox of this warm pool (image, entrypoint and resources default to its template's)")
	fl.StringVarP(&timeout, "timeout", "t", "", `lifetime such as 10m or 1h30m, or "none" (default: defaults.timeout, else 10m)`)
	fl.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.StringArrayVarP(&meta, "metadata", "m", nil, "metadata KEY=VALUE (repeatable)")
	fl.StringArrayVar(&ext, "extension", nil, "extension KEY=VALUE (repeatable)")
	fl.StringArrayVar(&resources, "resource", nil, "resource limit such as cpu=1 or memory=2Gi (repeatable; default cpu=1, memory=2Gi, or with --pool its template's)")
	fl.StringArrayVar(&entrypoint, "entrypoint", nil, "one word of the entrypoint's argv (repeat for each word)")
	fl.StringVar(&policyFile, "network-policy-file", "", "JSON file with the egress policy")
	fl.BoolVar(&credProxy, "credential-proxy", false, "enable the credential proxy (needs --network-policy-file)")
	fl.StringVar(&volumesFile, "volumes-file", "", "JSON file with an array of volumes")
	fl.BoolVar(&secure, "secure-access", false, "require a token on the sandbox's endpoints")
	fl.BoolVar(&skipHealth, "skip-health-check", false, "return without waiting for the sandbox to run")
	fl.Var(&durationValue{d: &readyTimeout}, "ready-timeout", "how long to wait for the sandbox to run (default 60s)")
	cmd.RegisterFlagCompletionFunc("pool", a.completePoolNames)
	return cmd
}

// readJSONFile decodes a JSON file into v, refusing unknown fields.
func readJSONFile(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: invalid JSON: %v", path, err)
	}
	return nil
}

// listDoc is the document of `osb sandbox list`.
type listDoc struct {
	Items      []sandboxView `json:"items"`
	Pagination pageView      `json:"pagination"`
}

type pageView struct {
	Page        int  `json:"page"`
	PageSize    int  `json:"page_size"`
	TotalItems  int  `json:"total_items"`
	TotalPages  int  `json:"total_pages"`
	HasNextPage bool `json:"has_next_page"`
}

func (a *app) sandboxList() *cobra.Command {
	var (
		states, meta   []string
		page, pageSize int
		all            bool
	)
	cmd := formats(&cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List sandboxes, newest first",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			opts := sdk.ListOptions{Page: page, PageSize: pageSize}
			for _, s := range states {
				n, ok := normalizeState(s)
				if !ok {
					return fmt.Errorf("invalid sandbox state %q: valid states are %s", s, strings.Join(validStates, ", "))
				}
				opts.States = append(opts.States, n)
			}
			if opts.Metadata, err = parseKeyValues(cmd, "--metadata", meta); err != nil {
				return err
			}
			if page < 0 || pageSize < 0 {
				return usagef(cmd, "--page and --page-size must be at least 1")
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			var doc listDoc
			var items []api.Sandbox
			if all {
				for sb, err := range c.All(cmd.Context(), opts) {
					if err != nil {
						return err
					}
					items = append(items, sb)
				}
				doc.Pagination = pageView{Page: 1, PageSize: len(items), TotalItems: len(items), TotalPages: min(len(items), 1)}
			} else {
				res, err := c.List(cmd.Context(), opts)
				if err != nil {
					return err
				}
				items = res.Items
				pg := res.Pagination
				doc.Pagination = pageView{pg.Page, pg.PageSize, pg.TotalItems, pg.TotalPages, pg.HasNextPage}
			}
			doc.Items = make([]sandboxView, 0, len(items))
			rows := make([][]string, 0, len(items))
			for i := range items {
				sb := &items[i]
				doc.Items = append(doc.Items, viewSandbox(sb))
				rows = append(rows, []string{sb.ID, sb.Status.State, imageOf(sb), timeText(&sb.CreatedAt), timeText(sb.ExpiresAt)})
			}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				p.table("Sandboxes", []string{"ID", "STATUS", "IMAGE", "CREATED_AT", "EXPIRES_AT"}, rows, "No sandboxes found.",
					func(col int, cell string) string {
						if col == 1 {
							return p.state(cell)
						}
						return cell
					})
				if doc.Pagination.HasNextPage {
					p.info(fmt.Sprintf("Page %d of %d (%d sandboxes); --page %d for more, or --all.",
						doc.Pagination.Page, doc.Pagination.TotalPages, doc.Pagination.TotalItems, doc.Pagination.Page+1))
				}
			})
		},
	}, formatTable, formatJSON, formatYAML)
	fl := cmd.Flags()
	fl.StringArrayVarP(&states, "state", "s", nil, "keep sandboxes in this state (repeatable: any of them)")
	fl.StringArrayVarP(&meta, "metadata", "m", nil, "keep sandboxes with metadata KEY=VALUE (repeatable: all of them)")
	fl.IntVar(&page, "page", 0, "page number, from 1")
	fl.IntVar(&pageSize, "page-size", 0, "sandboxes per page (at most 200)")
	fl.BoolVar(&all, "all", false, "list every page")
	return cmd
}

func (a *app) sandboxGet() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "get ID",
		Short: "Show a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			p := a.printerFor(f)
			return p.doc(viewSandbox(sb), func() {
				pairs := [][2]string{
					{"id", sb.ID},
					{"status", p.state(sb.Status.State)},
					{"image", imageOf(sb)},
					{"entrypoint", strings.Join(sb.Entrypoint, " ")},
					{"created_at", timeText(&sb.CreatedAt)},
					{"expires_at", first(timeText(sb.ExpiresAt), "never (manual cleanup)")},
				}
				for _, k := range sortedMapKeys(sb.Metadata) {
					pairs = append(pairs, [2]string{"metadata." + k, sb.Metadata[k]})
				}
				if sb.Status.Reason != "" {
					pairs = append(pairs, [2]string{"status_reason", sb.Status.Reason})
				}
				if sb.Status.Message != "" {
					pairs = append(pairs, [2]string{"status_message", sb.Status.Message})
				}
				p.kv("Sandbox Info", pairs)
			})
		},
	}, formatTable, formatJSON, formatYAML)
}

// killRow is one row of `osb sandbox kill`.
type killRow struct {
	SandboxID string `json:"sandbox_id"`
	Status    string `json:"status"`
}

func (a *app) sandboxKill() *cobra.Command {
	return formats(&cobra.Command{
		Use:     "kill ID...",
		Aliases: []string{"rm", "delete"},
		Short:   "Delete sandboxes",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			var rows []killRow
			var failed []error
			for _, id := range args {
				if err := c.Kill(cmd.Context(), id); err != nil {
					failed = append(failed, err)
					continue
				}
				rows = append(rows, killRow{id, "terminated"})
			}
			p := a.printerFor(f)
			if rows == nil {
				rows = []killRow{}
			}
			if len(rows) > 0 || f != formatTable {
				table := make([][]string, len(rows))
				for i, r := range rows {
					table[i] = []string{r.SandboxID, r.Status}
				}
				p.doc(rows, func() { p.table("Sandboxes", []string{"SANDBOX_ID", "STATUS"}, table, "", nil) })
			}
			return joinErrors(failed)
		},
	}, formatTable, formatJSON, formatYAML)
}

// joinErrors reports several failures, one per line but the last, which
// the caller prints.
func joinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return fmt.Errorf("%d failures: %s", len(errs), strings.Join(msgs, "; "))
}

func (a *app) sandboxPause() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "pause ID",
		Short: "Freeze a sandbox; its processes keep their memory",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			if err := c.Pause(cmd.Context(), args[0]); err != nil {
				return err
			}
			a.printerFor(f).success("Sandbox paused: " + args[0])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}

func (a *app) sandboxResume() *cobra.Command {
	var skip bool
	var wait time.Duration
	cmd := formats(&cobra.Command{
		Use:   "resume ID",
		Short: "Thaw a paused sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			if err := c.Resume(cmd.Context(), args[0]); err != nil {
				return err
			}
			if !skip {
				if err := c.Sandbox(args[0]).WaitReady(cmd.Context(), first2(wait, sdk.DefaultReadyTimeout)); err != nil {
					return err
				}
			}
			a.printerFor(f).success("Sandbox resumed: " + args[0])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().BoolVar(&skip, "skip-health-check", false, "return without waiting for execd to answer")
	cmd.Flags().Var(&durationValue{d: &wait}, "resume-timeout", "how long to wait for the sandbox to answer (default 60s)")
	return cmd
}

func first2(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// renewDoc is the document of `osb sandbox renew`.
type renewDoc struct {
	SandboxID string    `json:"sandbox_id"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (a *app) sandboxRenew() *cobra.Command {
	var d time.Duration
	cmd := formats(&cobra.Command{
		Use:   "renew ID --timeout DURATION",
		Short: "Set a sandbox to expire DURATION from now",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if d <= 0 {
				return usagef(cmd, "--timeout must be positive")
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			at, err := c.Renew(cmd.Context(), args[0], d)
			if err != nil {
				return err
			}
			doc := renewDoc{args[0], at.UTC()}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				p.kv("Sandbox Renewed", [][2]string{{"sandbox_id", doc.SandboxID}, {"expires_at", timeText(&doc.ExpiresAt)}})
			})
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().VarP(&durationValue{d: &d}, "timeout", "t", "new lifetime from now, such as 30m")
	cmd.MarkFlagRequired("timeout")
	return cmd
}

// endpointDoc is the document of `osb sandbox endpoint`.
type endpointDoc struct {
	Endpoint string            `json:"endpoint"`
	Headers  map[string]string `json:"headers"`
	// URL is the endpoint with the client's scheme.
	URL string `json:"url"`
	// ExpiresAt is set for a signed endpoint (--expires).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

func (a *app) sandboxEndpoint() *cobra.Command {
	var port int
	var expires time.Duration
	cmd := formats(&cobra.Command{
		Use:   "endpoint ID [PORT] [--port PORT] [--expires DURATION]",
		Short: "Show where a port of a sandbox is reached, and the headers to send",
		Long: `Show where a port of a sandbox is reached, and the headers every request
to it must carry.

With --expires, ask for a signed link through the server's ingress gateway,
valid for that long: it carries its own authorization, so it needs no
header. osb prints its URL, which a person can open in a browser when the
gateway routes by path or subdomain (route_mode "uri" or "wildcard").`,
		Example: `  osb sandbox endpoint 4f6c... 8080
  osb sandbox endpoint 4f6c... 8080 --expires 1h`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if len(args) == 2 {
				p, err := strconv.Atoi(args[1])
				if err != nil || cmd.Flags().Changed("port") && p != port {
					return usagef(cmd, "PORT %q: want one port, 1 to 65535 (as an argument or --port)", args[1])
				}
				port = p
			} else if !cmd.Flags().Changed("port") {
				return usagef(cmd, "give the port: osb sandbox endpoint ID PORT")
			}
			if port < 1 || port > 65535 {
				return usagef(cmd, "--port %d: want 1 to 65535", port)
			}
			if cmd.Flags().Changed("expires") && expires < time.Second {
				return usagef(cmd, "--expires %v: want a duration of at least 1s, such as 30m or 24h", expires)
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			var opts []sdk.EndpointOption
			var until *time.Time
			if expires > 0 {
				t := time.Now().Add(expires).Truncate(time.Second)
				until = &t
				opts = append(opts, sdk.WithExpiresAt(t))
			}
			ep, err := c.Endpoint(cmd.Context(), args[0], port, opts...)
			if err != nil {
				return err
			}
			doc := endpointDoc{Endpoint: ep.Endpoint, Headers: ep.Headers, URL: ep.URL(c.Protocol()), ExpiresAt: until}
			if doc.Headers == nil {
				doc.Headers = map[string]string{}
			}
			p := a.printerFor(f)
			if until != nil {
				return p.doc(doc, func() {
					fmt.Fprintln(p.out, doc.URL)
					fmt.Fprintf(p.err, "valid until %s (%s)\n", until.Local().Format(time.RFC3339), expires)
					if route := doc.Headers[api.HeaderIngressTo]; route != "" {
						p.warn("the gateway routes by header (route_mode \"header\"): a browser cannot open this URL; " +
							"send the header " + api.HeaderIngressTo + ": " + route + " with each request, " +
							"or ask the operator for route_mode \"uri\" or \"wildcard\"")
					}
				})
			}
			return p.doc(doc, func() {
				pairs := [][2]string{{"endpoint", doc.Endpoint}, {"url", doc.URL}}
				for _, k := range sortedMapKeys(doc.Headers) {
					pairs = append(pairs, [2]string{"header " + k, doc.Headers[k]})
				}
				p.kv("Sandbox Endpoint", pairs)
			})
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().IntVarP(&port, "port", "p", 0, "port inside the sandbox (or give it after ID)")
	cmd.Flags().DurationVar(&expires, "expires", 0, "ask for a signed link valid this long (e.g. 1h), through the ingress gateway")
	return cmd
}

// healthDoc is the document of `osb sandbox health`.
type healthDoc struct {
	SandboxID string `json:"sandbox_id"`
	Healthy   bool   `json:"healthy"`
}

func (a *app) sandboxHealth() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "health ID",
		Short: "Say whether a sandbox's execd answers (exit code 0 either way)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			sb := c.Sandbox(args[0])
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			perr := sb.Ping(ctx)
			doc := healthDoc{args[0], perr == nil}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				if doc.Healthy {
					p.success("Sandbox " + args[0] + " is healthy")
				} else {
					fmt.Fprintln(p.err, p.paint(colorRed, "Unhealthy:")+" sandbox "+args[0]+": "+oneLine(perr.Error()))
				}
			})
		},
	}, formatTable, formatJSON, formatYAML)
}

// metricsDoc is a metrics sample as osb prints it.
type metricsDoc struct {
	CPUCount   float64 `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_percentage"`
	MemTotal   float64 `json:"memory_total_in_mib"`
	MemUsed    float64 `json:"memory_used_in_mib"`
	Timestamp  int64   `json:"timestamp"`
}

func viewMetrics(m api.Metrics) metricsDoc {
	return metricsDoc{m.CPUCount, m.CPUUsedPct, m.MemTotalMiB, m.MemUsedMiB, m.Timestamp}
}

func (a *app) sandboxMetrics() *cobra.Command {
	var watch bool
	cmd := formats(&cobra.Command{
		Use:   "metrics ID",
		Short: "Show a sandbox's CPU and memory use (--watch: every second)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			def := ""
			if watch {
				def = formatRaw
			}
			f, err := a.format(cmd, def)
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			sb := c.Sandbox(args[0])
			p := a.printerFor(f)
			if !watch {
				m, err := sb.Metrics(cmd.Context())
				if err != nil {
					return err
				}
				doc := viewMetrics(*m)
				return p.doc(doc, func() { p.kv("Sandbox Metrics", metricsPairs(doc)) })
			}
			for m, err := range sb.WatchMetrics(cmd.Context()) {
				if err != nil {
					if _, ok := err.(*sdk.MetricsError); ok {
						p.warn(err.Error())
						continue
					}
					if cmd.Context().Err() != nil {
						return nil // Ctrl-C ends a watch normally
					}
					return err
				}
				doc := viewMetrics(m)
				switch f {
				case formatJSON:
					b, _ := json.Marshal(doc)
					fmt.Fprintln(p.out, string(b))
				case formatYAML:
					p.yaml(doc)
				default:
					fmt.Fprintf(p.out, "[%s] cpu=%.2f%% cores=%g mem=%.2f/%.2fMiB\n",
						time.UnixMilli(doc.Timestamp).UTC().Format(time.RFC3339), doc.CPUUsedPct, doc.CPUCount, doc.MemUsed, doc.MemTotal)
				}
			}
			return nil
		},
	}, formatTable, formatJSON, formatYAML, formatRaw)
	cmd.Flags().BoolVar(&watch, "watch", false, "print a sample every second until interrupted")
	return cmd
}

func metricsPairs(d metricsDoc) [][2]string {
	return [][2]string{
		{"cpu_count", strconv.FormatFloat(d.CPUCount, 'f', -1, 64)},
		{"cpu_used_percentage", strconv.FormatFloat(d.CPUUsedPct, 'f', 2, 64)},
		{"memory_total_in_mib", strconv.FormatFloat(d.MemTotal, 'f', 2, 64)},
		{"memory_used_in_mib", strconv.FormatFloat(d.MemUsed, 'f', 2, 64)},
		{"timestamp", time.UnixMilli(d.Timestamp).UTC().Format(time.RFC3339)},
	}
}

func sortedMapKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortStrings(keys)
	return keys
}
