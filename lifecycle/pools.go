package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
	"github.com/opensandbox/opensandbox/internal/httpx"
	"github.com/opensandbox/opensandbox/sandbox"
)

// maxPoolSize bounds a pool's poolMax: a typo must not start ten thousand
// containers.
const maxPoolSize = 1000

// poolNameRE is what a pool's name may be: a DNS label, as pool names are
// on Kubernetes.
var poolNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// pooler returns the runtime's warm pools, or the 501 the reference
// answers where there are none.
func (s *Server) pooler() (sandbox.Pooler, error) {
	p, ok := s.rt.(sandbox.Pooler)
	if !ok {
		return nil, httpErr(http.StatusNotImplemented, codePoolNotImpl, "this server's runtime has no warm pools")
	}
	return p, nil
}

// poolExtensions are the extensions a pool's template may give the
// sandboxes it hands out.
var poolExtensions = []string{extIngressPublic, extRenewExtend}

// PoolFromRequest validates a pool's definition as the /pools routes and
// the configuration file give it.
func PoolFromRequest(req *api.PoolRequest) (sandbox.Pool, error) {
	var p sandbox.Pool
	if !poolNameRE.MatchString(req.Name) {
		return p, invalid(codeInvalidParameter, "pool name %q: want lower-case letters, digits and '-', at most 63, starting and ending with a letter or digit", req.Name)
	}
	p.Name = req.Name
	t := req.Template
	if t == nil || t.Image == nil || strings.TrimSpace(t.Image.URI) == "" {
		return p, invalid(codeInvalidParameter, "pool %s: template.image.uri is required", req.Name)
	}
	if err := checkImageRef(t.Image.URI); err != nil {
		return p, invalid(codeInvalidParameter, "pool %s: template.image.uri %q: %v", req.Name, t.Image.URI, err)
	}
	if t.Image.Auth != nil {
		return p, invalid(codeInvalidParameter, "pool %s: registry credentials are not kept, so a pool cannot pull with them: load the image on the host first", req.Name)
	}
	p.Template.Image = t.Image.URI
	if t.Entrypoint != nil {
		if err := checkEntrypoint(t.Entrypoint); err != nil {
			return p, invalid(codeInvalidParameter, "pool %s: template.entrypoint: %v", req.Name, err)
		}
		p.Template.Entrypoint = slices.Clone(t.Entrypoint)
	}
	for k, v := range t.Env {
		if k == "" || k == reservedEnv || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return p, invalid(codeInvalidParameter, "pool %s: template.env %q: names must be non-empty without '=' or NUL, values without NUL", req.Name, k)
		}
	}
	p.Template.Env = maps.Clone(t.Env)
	if err := checkExecSize(t.Env, t.Entrypoint); err != nil {
		var he *httpx.Error
		if errors.As(err, &he) {
			return p, invalid(he.Code, "pool %s: template.%s", req.Name, he.Message)
		}
		return p, err
	}
	res, err := parseResources(t.ResourceLimits)
	if err != nil {
		return p, invalid(codeInvalidParameter, "pool %s: template.resourceLimits: %v", req.Name, err)
	}
	p.Template.Resources = res
	if len(t.NetworkPolicy) > 0 && string(t.NetworkPolicy) != "null" {
		pol, err := egress.ParsePolicy(t.NetworkPolicy)
		if err != nil {
			return p, invalid(codeInvalidParameter, "pool %s: template.networkPolicy: %v", req.Name, err)
		}
		if p.Template.NetworkPolicy, err = json.Marshal(pol.API()); err != nil {
			return p, err
		}
	}
	for k, v := range t.Extensions {
		if !slices.Contains(poolExtensions, k) {
			return p, invalid(codeInvalidParameter, "pool %s: template.extensions[%q]: a pool's template takes %s only", req.Name, k, strings.Join(poolExtensions, " and "))
		}
		if err := checkExtensions(map[string]string{k: v}); err != nil {
			var he *httpx.Error
			if errors.As(err, &he) {
				return p, invalid(he.Code, "pool %s: template.%s", req.Name, he.Message)
			}
			return p, err
		}
	}
	if len(t.Extensions) > 0 {
		p.Template.Extensions = maps.Clone(t.Extensions)
	}
	c := req.CapacitySpec
	if c == nil {
		return p, invalid(codeInvalidParameter, "pool %s: capacitySpec is required", req.Name)
	}
	switch {
	case c.BufferMin < 0 || c.BufferMax < 0 || c.PoolMin < 0 || c.PoolMax < 0:
		return p, invalid(codeInvalidParameter, "pool %s: capacitySpec values must not be negative", req.Name)
	case c.BufferMin > c.BufferMax:
		return p, invalid(codeInvalidParameter, "pool %s: bufferMin (%d) must not exceed bufferMax (%d)", req.Name, c.BufferMin, c.BufferMax)
	case c.PoolMin > c.PoolMax:
		return p, invalid(codeInvalidParameter, "pool %s: poolMin (%d) must not exceed poolMax (%d)", req.Name, c.PoolMin, c.PoolMax)
	case c.BufferMax > c.PoolMax:
		return p, invalid(codeInvalidParameter, "pool %s: bufferMax (%d) must not exceed poolMax (%d)", req.Name, c.BufferMax, c.PoolMax)
	case c.PoolMax > maxPoolSize:
		return p, invalid(codeInvalidParameter, "pool %s: poolMax (%d) is over the most a pool may hold, %d", req.Name, c.PoolMax, maxPoolSize)
	}
	p.Capacity = sandbox.Capacity{BufferMin: c.BufferMin, BufferMax: c.BufferMax, PoolMin: c.PoolMin, PoolMax: c.PoolMax}
	return p, nil
}

// toAPIPool is a pool as the /pools routes answer it.
func toAPIPool(info *sandbox.PoolInfo) api.Pool {
	t := &info.Template
	created := info.CreatedAt
	st := info.Status
	return api.Pool{
		Name: info.Name,
		Template: &api.PoolTemplate{
			Image: &api.ImageSpec{URI: t.Image}, Entrypoint: t.Entrypoint, Env: t.Env,
			ResourceLimits: formatResources(t.Resources), NetworkPolicy: t.NetworkPolicy, Extensions: t.Extensions,
		},
		CapacitySpec: api.CapacitySpec{BufferMax: info.Capacity.BufferMax, BufferMin: info.Capacity.BufferMin,
			PoolMax: info.Capacity.PoolMax, PoolMin: info.Capacity.PoolMin},
		Status: &api.PoolStatus{Total: st.Total, Allocated: st.Allocated, Available: st.Available,
			Revision: strconv.FormatInt(info.Revision, 10), Starting: st.Starting, Claims: st.Claims, Misses: st.Misses, Error: st.Error},
		CreatedAt: &created,
	}
}

// formatResources writes resources back as resourceLimits.
func formatResources(r sandbox.Resources) map[string]string {
	out := map[string]string{}
	if r.CPUMillis > 0 {
		if r.CPUMillis%1000 == 0 {
			out["cpu"] = strconv.FormatInt(r.CPUMillis/1000, 10)
		} else {
			out["cpu"] = strconv.FormatInt(r.CPUMillis, 10) + "m"
		}
	}
	if r.MemoryBytes > 0 {
		out["memory"] = formatBytes(r.MemoryBytes)
	}
	if r.GPUs != "" {
		out["gpu"] = r.GPUs
	}
	if r.StorageBytes > 0 {
		out["ephemeral-storage"] = formatBytes(r.StorageBytes)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func formatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// checkPoolTemplate applies to a pool made through the API what a create
// gets: no image from a local registry unless allowed, nothing larger
// than the runtime's largest machine. Pools of the configuration file
// are the operator's, and not checked.
func (s *Server) checkPoolTemplate(ctx context.Context, def *sandbox.Pool) error {
	field := "pool " + def.Name + ": template"
	if err := s.checkRegistry(field+".image.uri", def.Template.Image); err != nil {
		return err
	}
	if def.Template.NetworkPolicy != nil {
		if s.cfg.Egress == nil {
			return invalid(codeInvalidParameter, "%s.networkPolicy: this server's runtime does not enforce network policies", field)
		}
		var p api.NetworkPolicy
		json.Unmarshal(def.Template.NetworkPolicy, &p)
		if cap := s.cfg.Egress.RuleCap(); cap > 0 && len(p.Egress) > cap {
			return invalid(codeInvalidParameter, "%s.networkPolicy: %d rules, more than this server's cap of %d", field, len(p.Egress), cap)
		}
	}
	return s.checkHostSize(ctx, field+".resourceLimits", def.Template.Resources)
}

// createPool answers POST /pools.
func (s *Server) createPool(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pooler()
	if err != nil {
		return err
	}
	var req api.PoolRequest
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	def, err := PoolFromRequest(&req)
	if err != nil {
		return err
	}
	if err := s.checkPoolTemplate(r.Context(), &def); err != nil {
		return err
	}
	info, err := p.CreatePool(r.Context(), def)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, toAPIPool(info))
}

// listPools answers GET /pools.
func (s *Server) listPools(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pooler()
	if err != nil {
		return err
	}
	infos, err := p.ListPools(r.Context())
	if err != nil {
		return err
	}
	out := api.ListPoolsResponse{Items: make([]api.Pool, 0, len(infos))}
	for _, info := range infos {
		out.Items = append(out.Items, toAPIPool(info))
	}
	return writeJSON(w, http.StatusOK, out)
}

// getPool answers GET /pools/{name}.
func (s *Server) getPool(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pooler()
	if err != nil {
		return err
	}
	info, err := p.GetPool(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPIPool(info))
}

// updatePool answers PUT /pools/{name}: the body's name, when given, must
// be the path's.
func (s *Server) updatePool(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pooler()
	if err != nil {
		return err
	}
	var req api.PoolRequest
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	name := r.PathValue("name")
	if req.Name == "" {
		req.Name = name
	}
	if req.Name != name {
		return invalid(codeInvalidParameter, "the body names pool %q, the path %q", req.Name, name)
	}
	if req.Template == nil || req.CapacitySpec == nil {
		// A partial update keeps what it does not give.
		cur, err := p.GetPool(r.Context(), name)
		if err != nil {
			return err
		}
		was := toAPIPool(cur)
		if req.Template == nil {
			req.Template = was.Template
		}
		if req.CapacitySpec == nil {
			req.CapacitySpec = &was.CapacitySpec
		}
	}
	def, err := PoolFromRequest(&req)
	if err != nil {
		return err
	}
	if err := s.checkPoolTemplate(r.Context(), &def); err != nil {
		return err
	}
	info, err := p.UpdatePool(r.Context(), def)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPIPool(info))
}

// deletePool answers DELETE /pools/{name} with 204.
func (s *Server) deletePool(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pooler()
	if err != nil {
		return err
	}
	if err := p.DeletePool(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
