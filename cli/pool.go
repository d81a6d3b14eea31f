package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// poolView is a pool as osb prints it. The template's environment shows
// its names only: its values may be credentials, and osb's output ends
// up in terminals' scrollback and in logs.
type poolView struct {
	Name      string           `json:"name"`
	Template  poolTemplateView `json:"template"`
	Capacity  capacityView     `json:"capacity"`
	Status    *poolStatusView  `json:"status"`
	CreatedAt *time.Time       `json:"created_at"`
}

type poolTemplateView struct {
	Image          string            `json:"image"`
	Entrypoint     []string          `json:"entrypoint"`
	EnvNames       []string          `json:"env_names"`
	ResourceLimits map[string]string `json:"resource_limits"`
	Extensions     map[string]string `json:"extensions"`
}

type capacityView struct {
	BufferMin int `json:"buffer_min"`
	BufferMax int `json:"buffer_max"`
	PoolMin   int `json:"pool_min"`
	PoolMax   int `json:"pool_max"`
}

type poolStatusView struct {
	Total     int     `json:"total"`
	Allocated int     `json:"allocated"`
	Available int     `json:"available"`
	Starting  int     `json:"starting"`
	Revision  string  `json:"revision"`
	Claims    uint64  `json:"claims"`
	Misses    uint64  `json:"misses"`
	Error     *string `json:"error"`
}

func viewPool(p *api.Pool) poolView {
	c := p.CapacitySpec
	v := poolView{Name: p.Name, CreatedAt: p.CreatedAt,
		Capacity: capacityView{BufferMin: c.BufferMin, BufferMax: c.BufferMax, PoolMin: c.PoolMin, PoolMax: c.PoolMax}}
	if t := p.Template; t != nil {
		v.Template = poolTemplateView{Image: poolImage(p), Entrypoint: t.Entrypoint, EnvNames: sdk.EnvNames(t), ResourceLimits: t.ResourceLimits, Extensions: t.Extensions}
	}
	if s := p.Status; s != nil {
		v.Status = &poolStatusView{Total: s.Total, Allocated: s.Allocated, Available: s.Available, Starting: s.Starting,
			Revision: s.Revision, Claims: s.Claims, Misses: s.Misses, Error: optional(s.Error)}
	}
	return v
}

func poolImage(p *api.Pool) string {
	if p.Template != nil && p.Template.Image != nil {
		return p.Template.Image.URI
	}
	return ""
}

// pairsText writes a map as "cpu=500m memory=256Mi", sorted by key.
func pairsText(m map[string]string) string {
	parts := make([]string, 0, len(m))
	for _, k := range sortedMapKeys(m) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, " ")
}

// poolCommand is `osb pool`.
func (a *app) poolCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "Manage warm pools: sandboxes started ahead of time",
		Long: `A warm pool keeps sandboxes of one template started ahead of time, so
that a create from it takes milliseconds instead of a container start:

  osb pool create py --image python:3.11 --buffer-min 2 --buffer-max 4 --pool-max 10
  osb sandbox create --pool py

Ready sandboxes are refilled up to --buffer-max whenever they fall below
--buffer-min; the pool's sandboxes, handed-out ones included, number from
--pool-min to --pool-max. A sandbox handed out is an ordinary sandbox and
never goes back to the pool. Servers whose runtime has no pools answer
"not supported".`,
	}
	cmd.AddCommand(a.poolCreate(), a.poolGet(), a.poolList(), a.poolUpdate(), a.poolDelete())
	return cmd
}

// poolFlags are the flags of a pool's template and capacity, shared by
// create and update.
type poolFlags struct {
	image                                  string
	entrypoint, env, unsetEnv, resources   []string
	extensions                             []string
	bufferMin, bufferMax, poolMin, poolMax int
	wait                                   bool
	waitMax                                time.Duration
}

var capacityFlagNames = []string{"buffer-min", "buffer-max", "pool-min", "pool-max"}

func (pf *poolFlags) register(cmd *cobra.Command, update bool) {
	fl := cmd.Flags()
	fl.StringVarP(&pf.image, "image", "i", "", "container image of the pool's sandboxes (local to the server's engine, or in a registry that needs no credentials)")
	fl.StringArrayVar(&pf.entrypoint, "entrypoint", nil, "one word of the entrypoint's argv (repeat for each word); it starts when a sandbox is handed out")
	fl.StringArrayVarP(&pf.env, "env", "e", nil, "environment variable KEY=VALUE of every sandbox (repeatable)")
	fl.StringArrayVar(&pf.resources, "resource", nil, "resource limit such as cpu=1 or memory=2Gi (repeatable; default: the server's)")
	fl.StringArrayVar(&pf.extensions, "extension", nil, "extension KEY=VALUE of every sandbox handed out: ingress.public=true, access.renew.extend.seconds=N (repeatable)")
	fl.IntVar(&pf.bufferMin, "buffer-min", 0, "refill when fewer sandboxes than this are ready")
	fl.IntVar(&pf.bufferMax, "buffer-max", 0, "refill up to this many ready sandboxes")
	fl.IntVar(&pf.poolMin, "pool-min", 0, "keep at least this many sandboxes, handed-out ones included")
	fl.IntVar(&pf.poolMax, "pool-max", 0, "keep at most this many sandboxes, handed-out ones included (at most 1000)")
	fl.BoolVar(&pf.wait, "wait", false, "wait until --buffer-min sandboxes are ready")
	pf.waitMax = 10 * time.Minute
	fl.Var(&durationValue{d: &pf.waitMax}, "wait-timeout", "how long --wait waits")
	if update {
		fl.StringArrayVar(&pf.unsetEnv, "unset-env", nil, "remove the environment variable KEY (repeatable)")
	}
}

// capacity is the flags' capacity over base: what was not given is
// base's.
func (pf *poolFlags) capacity(cmd *cobra.Command, base sdk.Capacity) (sdk.Capacity, bool) {
	changed := false
	for _, f := range []struct {
		name     string
		src, dst *int
	}{
		{"buffer-min", &pf.bufferMin, &base.BufferMin},
		{"buffer-max", &pf.bufferMax, &base.BufferMax},
		{"pool-min", &pf.poolMin, &base.PoolMin},
		{"pool-max", &pf.poolMax, &base.PoolMax},
	} {
		if flagChanged(cmd.Flags(), f.name) {
			*f.dst, changed = *f.src, true
		}
	}
	return base, changed
}

// template is the flags' template over base: --image and --entrypoint
// replace base's, -e, --resource and --extension add to or replace its
// entries, --unset-env removes variables.
func (pf *poolFlags) template(cmd *cobra.Command, base sdk.PoolTemplate) (sdk.PoolTemplate, bool, error) {
	fl := cmd.Flags()
	changed := false
	if fl.Changed("image") {
		if strings.TrimSpace(pf.image) == "" {
			return base, false, usagef(cmd, "--image must not be empty")
		}
		base.Image, changed = pf.image, true
	}
	if fl.Changed("entrypoint") {
		base.Entrypoint, changed = pf.entrypoint, true
	}
	env, err := parseKeyValues(cmd, "--env", pf.env)
	if err != nil {
		return base, false, err
	}
	res, err := parseKeyValues(cmd, "--resource", pf.resources)
	if err != nil {
		return base, false, err
	}
	ext, err := parseKeyValues(cmd, "--extension", pf.extensions)
	if err != nil {
		return base, false, err
	}
	if len(env) > 0 || len(pf.unsetEnv) > 0 {
		merged := maps.Clone(base.Env)
		if merged == nil {
			merged = map[string]string{}
		}
		maps.Copy(merged, env)
		for _, k := range pf.unsetEnv {
			if _, ok := merged[k]; !ok {
				return base, false, fmt.Errorf("--unset-env %s: the pool has no such variable", k)
			}
			delete(merged, k)
		}
		base.Env, changed = merged, true
	}
	if len(res) > 0 {
		merged := maps.Clone(base.Resources)
		if merged == nil {
			merged = map[string]string{}
		}
		maps.Copy(merged, res)
		base.Resources, changed = merged, true
	}
	if len(ext) > 0 {
		merged := maps.Clone(base.Extensions)
		if merged == nil {
			merged = map[string]string{}
		}
		maps.Copy(merged, ext)
		base.Extensions, changed = merged, true
	}
	return base, changed, nil
}

// waitPool waits, when --wait was given, until the pool has bufferMin
// ready sandboxes, and returns it as it is then.
func (a *app) waitPool(cmd *cobra.Command, c *sdk.Client, pf *poolFlags, p *api.Pool) (*api.Pool, error) {
	if !pf.wait {
		return p, nil
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), pf.waitMax)
	defer cancel()
	ready, err := c.Pools().Wait(ctx, p.Name, p.CapacitySpec.BufferMin, 200*time.Millisecond)
	var we *sdk.PoolWaitError
	if errors.As(err, &we) && ctx.Err() != nil && cmd.Context().Err() == nil {
		return nil, fmt.Errorf("%v (--wait-timeout %v); osb pool get %s shows how it goes on", we, pf.waitMax, p.Name)
	}
	return ready, err
}

func (a *app) poolCreate() *cobra.Command {
	var pf poolFlags
	cmd := formats(&cobra.Command{
		Use:   "create NAME",
		Short: "Create a warm pool",
		Long: `Create the warm pool NAME (lower-case letters, digits and '-') and print
it. Its sandboxes start in the background; with --wait osb waits until
--buffer-min of them are ready, and fails (exit 1) if --wait-timeout
passes first, saying why the pool's last sandbox failed to start if one
did.

--extension gives every sandbox the pool hands out an extension, under
the create's own: ingress.public=true (the ingress gateway serves it
without a token) or access.renew.extend.seconds=N (each request through
the gateway renews it, N from 300 to 86400). The server refuses other
keys.`,
		Example: `  osb pool create py --image python:3.11 --resource cpu=1 --resource memory=1Gi --buffer-min 2 --buffer-max 4 --pool-max 10
  osb pool create agents -i opensandbox/busybox --entrypoint sleep --entrypoint infinity -e MODE=agent --buffer-min 1 --buffer-max 1 --pool-max 5 --wait
  osb pool create web -i opensandbox/busybox --extension ingress.public=true --extension access.renew.extend.seconds=600 --pool-max 5`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("image") {
				return usagef(cmd, "--image is required")
			}
			if !cmd.Flags().Changed("pool-max") {
				return usagef(cmd, "--pool-max is required")
			}
			if pf.waitMax <= 0 {
				return usagef(cmd, "--wait-timeout must be positive")
			}
			tmpl, _, err := pf.template(cmd, sdk.PoolTemplate{})
			if err != nil {
				return err
			}
			capacity, _ := pf.capacity(cmd, sdk.Capacity{})
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			p, err := c.Pools().Create(cmd.Context(), args[0], tmpl, capacity)
			if err != nil {
				return err
			}
			if p, err = a.waitPool(cmd, c, &pf, p); err != nil {
				return err
			}
			return a.printPool(f, "Pool Created", p)
		},
	}, formatTable, formatJSON, formatYAML)
	pf.register(cmd, false)
	return cmd
}

func (a *app) poolUpdate() *cobra.Command {
	var pf poolFlags
	cmd := formats(&cobra.Command{
		Use:   "update NAME",
		Short: "Change a warm pool's template or capacity",
		Long: `Change the pool NAME; what no flag names is kept. --image and
--entrypoint replace the template's; -e and --resource add or replace one
entry each, --unset-env removes a variable. A change of image, environment
or resources gives the pool a new revision, and its ready sandboxes are
replaced; handed-out ones are not touched.`,
		Example: `  osb pool update py --buffer-max 8 --pool-max 20
  osb pool update py -e MODE=fast --unset-env DEBUG --wait`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completePoolNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if pf.waitMax <= 0 {
				return usagef(cmd, "--wait-timeout must be positive")
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			name := args[0]
			cur, err := c.Pools().Get(cmd.Context(), name)
			if err != nil {
				return err
			}
			// A template sent replaces the whole one: carry over what the
			// flags do not change, the network policy and extensions too.
			base := sdk.PoolTemplate{Image: poolImage(cur)}
			if t := cur.Template; t != nil {
				base.Entrypoint, base.Env, base.Resources, base.Extensions = t.Entrypoint, t.Env, t.ResourceLimits, t.Extensions
				if len(t.NetworkPolicy) > 0 && string(t.NetworkPolicy) != "null" {
					base.NetworkPolicy = new(api.NetworkPolicy)
					if err := json.Unmarshal(t.NetworkPolicy, base.NetworkPolicy); err != nil {
						return fmt.Errorf("pool %s: read its template's network policy: %w", name, err)
					}
				}
			}
			var u sdk.PoolUpdate
			tmpl, tmplChanged, err := pf.template(cmd, base)
			if err != nil {
				return err
			}
			if tmplChanged {
				u.Template = &tmpl
			}
			if capacity, ok := pf.capacity(cmd, cur.CapacitySpec); ok {
				u.Capacity = &capacity
			}
			if u.Template == nil && u.Capacity == nil {
				return usagef(cmd, "nothing to change: give a template flag (--image, --entrypoint, -e, --unset-env, --resource, --extension) or a capacity flag (--%s)", strings.Join(capacityFlagNames, ", --"))
			}
			p, err := c.Pools().Update(cmd.Context(), name, u)
			if err != nil {
				return err
			}
			if p, err = a.waitPool(cmd, c, &pf, p); err != nil {
				return err
			}
			return a.printPool(f, "Pool Updated", p)
		},
	}, formatTable, formatJSON, formatYAML)
	pf.register(cmd, true)
	return cmd
}

func (a *app) poolGet() *cobra.Command {
	return formats(&cobra.Command{
		Use:               "get NAME",
		Short:             "Show a warm pool and what it holds",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completePoolNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			p, err := c.Pools().Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printPool(f, "Pool Info", p)
		},
	}, formatTable, formatJSON, formatYAML)
}

// printPool prints one pool under title.
func (a *app) printPool(f, title string, p *api.Pool) error {
	pr := a.printerFor(f)
	v := viewPool(p)
	return pr.doc(v, func() {
		t, c := v.Template, v.Capacity
		pairs := [][2]string{
			{"name", v.Name},
			{"image", t.Image},
			{"entrypoint", strings.Join(t.Entrypoint, " ")},
			{"env", strings.Join(t.EnvNames, " ")},
			{"resources", pairsText(t.ResourceLimits)},
			{"extensions", pairsText(t.Extensions)},
			{"buffer", fmt.Sprintf("%d-%d ready", c.BufferMin, c.BufferMax)},
			{"pool", fmt.Sprintf("%d-%d sandboxes", c.PoolMin, c.PoolMax)},
		}
		if s := v.Status; s != nil {
			pairs = append(pairs,
				[2]string{"ready", strconv.Itoa(s.Available)},
				[2]string{"starting", strconv.Itoa(s.Starting)},
				[2]string{"handed_out", strconv.Itoa(s.Allocated)},
				[2]string{"claims", strconv.FormatUint(s.Claims, 10)},
				[2]string{"misses", strconv.FormatUint(s.Misses, 10)},
				[2]string{"revision", s.Revision})
			if s.Error != nil {
				pairs = append(pairs, [2]string{"error", *s.Error})
			}
		}
		pairs = append(pairs, [2]string{"created_at", timeText(v.CreatedAt)})
		pr.kv(title, pairs)
	})
}

// poolListDoc is the document of `osb pool list`.
type poolListDoc struct {
	Items []poolView `json:"items"`
}

func (a *app) poolList() *cobra.Command {
	return formats(&cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List warm pools, by name",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			pools, err := c.Pools().List(cmd.Context())
			if err != nil {
				return err
			}
			doc := poolListDoc{Items: make([]poolView, 0, len(pools))}
			rows := make([][]string, 0, len(pools))
			for i := range pools {
				v := viewPool(&pools[i])
				doc.Items = append(doc.Items, v)
				ready, starting, out, problem := "", "", "", ""
				if s := v.Status; s != nil {
					ready = fmt.Sprintf("%d/%d", s.Available, v.Capacity.BufferMax)
					starting, out = strconv.Itoa(s.Starting), strconv.Itoa(s.Allocated)
					if s.Error != nil {
						problem = *s.Error
					}
				}
				rows = append(rows, []string{v.Name, v.Template.Image, ready, starting, out, fmt.Sprintf("%d-%d", v.Capacity.PoolMin, v.Capacity.PoolMax), problem})
			}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				p.table("Pools", []string{"NAME", "IMAGE", "READY", "STARTING", "HANDED_OUT", "POOL", "ERROR"}, rows, "No pools found.", nil)
			})
		},
	}, formatTable, formatJSON, formatYAML)
}

func (a *app) poolDelete() *cobra.Command {
	return formats(&cobra.Command{
		Use:               "delete NAME",
		Aliases:           []string{"rm"},
		Short:             "Delete a warm pool and its ready sandboxes; those it handed out live on",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completePoolNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			if err := c.Pools().Delete(cmd.Context(), args[0]); err != nil {
				return err
			}
			a.printerFor(f).success("Pool deleted: " + args[0])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}

// completePoolNames completes a pool name, each described by its image.
func (a *app) completePoolNames(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, ctx, cancel := a.completionClient(cmd)
	if c == nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	defer cancel()
	pools, err := c.Pools().List(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for i := range pools {
		if strings.HasPrefix(pools[i].Name, toComplete) {
			out = append(out, pools[i].Name+"\t"+poolImage(&pools[i]))
		}
	}
	slices.Sort(out)
	return out, cobra.ShellCompDirectiveNoFileComp
}
