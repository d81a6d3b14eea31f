package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/go-connections/nat"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// A sandbox created with a network policy runs in two containers. The
// egress container (osb-egress, image cfg.Egress.Image) is made first: it
// owns the network namespace and the published ports, holds
// CAP_NET_ADMIN, and programs the namespace's firewall, DNS proxy and
// transparent proxy. The sandbox's container joins that namespace
// (network mode "container:") with no network capability of its own, and
// is made only once osb-egress answers /healthz, which it does once its
// rules are in force: the sandbox's first process never runs unfiltered.
//
// The egress API (port 18080) is published on the host from the egress
// container; the endpoint for it never passes through execd, and the
// namespace's firewall drops what sandbox processes send to it.

// Label keys of egress containers. They carry no labelScope, so that
// nothing takes them for sandboxes.
const (
	// labelEgress, on a sandbox's container, names its egress container.
	labelEgress = "opensandbox.egress"
	// labelEgressOf, on an egress container, is its sandbox's ID;
	// labelEgressScope the server's label scope.
	labelEgressOf    = "opensandbox.egress-of"
	labelEgressScope = "opensandbox.egress-scope"
)

// The environment osb-egress reads (egress.md §6, and ours).
const (
	envEgressRules       = "OPENSANDBOX_EGRESS_RULES"
	envEgressMode        = "OPENSANDBOX_EGRESS_MODE"
	envEgressToken       = "OPENSANDBOX_EGRESS_TOKEN"
	envEgressPolicyFile  = "OPENSANDBOX_EGRESS_POLICY_FILE"
	envEgressMaxRules    = "OPENSANDBOX_EGRESS_MAX_RULES"
	envEgressUpstreams   = "OPENSANDBOX_EGRESS_DNS_UPSTREAMS"
	envEgressAlwaysDeny  = "OPENSANDBOX_EGRESS_ALWAYS_DENY"
	envEgressAlwaysAllow = "OPENSANDBOX_EGRESS_ALWAYS_ALLOW"
)

// egressPolicyFile is where osb-egress keeps the policy in force, in its
// container's own writable layer: it survives osb-egress restarting, the
// server restarting, and the container restarting.
const egressPolicyFile = "/var/lib/osb-egress/policy.json"

// egressName is the name of sandbox id's egress container.
func egressName(id sandbox.ID) string { return containerName(id) + "-egress" }

// hasEgress reports whether a sandbox made from spec runs beside
// osb-egress.
func hasEgress(spec *sandbox.Spec) bool { return spec.NetworkPolicy != nil }

// publishedPorts are the ports of a sandbox published on the host, with
// their bindings: execd's, the app port unless every port goes through
// execd (secure access), and with extra the egress API.
func publishedPorts(cfg *Config, secure, egressAPI bool) (nat.PortSet, nat.PortMap) {
	exposed, bindings := nat.PortSet{}, nat.PortMap{}
	add := func(port int) {
		p := nat.Port(strconv.Itoa(port) + "/tcp")
		exposed[p] = struct{}{}
		bindings[p] = []nat.PortBinding{{HostIP: cfg.BindIP}}
	}
	add(api.ExecdPort)
	if !secure {
		add(sandbox.PortApp)
	}
	if egressAPI {
		add(sandbox.PortEgress)
	}
	return exposed, bindings
}

// egressContainerConfig is the egress container of sandbox id.
// vaultEnv is the credential proxy's environment, for a sandbox that has
// it.
func egressContainerConfig(cfg *Config, id sandbox.ID, spec *sandbox.Spec, token string, vaultEnv []string) (*container.Config, *container.HostConfig) {
	eg := &cfg.Egress
	exposed, bindings := publishedPorts(cfg, spec.SecureAccess, true)
	env := []string{
		envEgressRules + "=" + string(spec.NetworkPolicy),
		envEgressMode + "=" + eg.Mode,
		envEgressToken + "=" + token,
		envEgressPolicyFile + "=" + egressPolicyFile,
		envEgressMaxRules + "=" + strconv.Itoa(eg.RuleCap()),
	}
	if len(eg.DNSUpstreams) > 0 {
		env = append(env, envEgressUpstreams+"="+strings.Join(eg.DNSUpstreams, ","))
	}
	if len(eg.AlwaysDeny) > 0 {
		env = append(env, envEgressAlwaysDeny+"="+strings.Join(eg.AlwaysDeny, ","))
	}
	if len(eg.AlwaysAllow) > 0 {
		env = append(env, envEgressAlwaysAllow+"="+strings.Join(eg.AlwaysAllow, ","))
	}
	env = append(env, vaultEnv...)
	cc := &container.Config{
		Image:        eg.Image,
		Env:          env,
		ExposedPorts: exposed,
		Labels: map[string]string{
			labelEgressOf:    string(id),
			labelEgressScope: cfg.LabelScope,
		},
	}
	pids := int64(256)
	hc := &container.HostConfig{
		NetworkMode:  container.NetworkMode(cfg.Network),
		PortBindings: bindings,
		// NET_ADMIN programs the namespace's nftables and marks
		// osb-egress's own sockets; nothing else is needed.
		CapDrop:     []string{"ALL"},
		CapAdd:      []string{"NET_ADMIN"},
		SecurityOpt: []string{"no-new-privileges:true"},
		DNS:         cfg.DNS,
		Resources: container.Resources{
			Memory:    256 << 20,
			PidsLimit: &pids,
		},
	}
	if eg.Mode == sandbox.EgressStrict {
		// Strict mode does not proxy IPv6: the namespace has none.
		hc.Sysctls = map[string]string{
			"net.ipv6.conf.all.disable_ipv6":     "1",
			"net.ipv6.conf.default.disable_ipv6": "1",
		}
	}
	return cc, hc
}

// joinEgress makes the sandbox's container configuration join its egress
// container's network namespace, where the ports are published.
func joinEgress(id sandbox.ID, cc *container.Config, hc *container.HostConfig) {
	cc.Labels[labelEgress] = egressName(id)
	cc.ExposedPorts = nil
	hc.NetworkMode = container.NetworkMode("container:" + egressName(id))
	hc.PortBindings = nil
	hc.DNS = nil
}

// makeEgress makes sandbox id's egress container unless it exists. It
// is started by restartEgress.
func (r *Runtime) makeEgress(ctx context.Context, e *entry, spec *sandbox.Spec, token string) error {
	name := egressName(e.sb.ID)
	_, err := r.eng.inspect(ctx, name)
	if !errors.Is(err, errNoSuchObject) {
		if err != nil {
			return &failure{"EGRESS_START_FAILED", fmt.Sprintf("inspect the egress container: %v", err)}
		}
		return nil
	}
	if err := r.ensureImage(ctx, e, &sandbox.Spec{Image: r.cfg.Egress.Image}); err != nil {
		return &failure{"EGRESS_START_FAILED", fmt.Sprintf("the egress image %s: %v", r.cfg.Egress.Image, err)}
	}
	var vaultEnv []string
	if spec.CredentialProxy {
		key, err := r.cfg.Egress.SandboxVaultKey(e.sb.ID)
		if err != nil {
			return &failure{"EGRESS_START_FAILED", fmt.Sprintf("the vault key: %v", err)}
		}
		vaultEnv = r.cfg.Egress.CredentialProxyEnv(key, r.vaultPeers(ctx))
	}
	cc, hc := egressContainerConfig(&r.cfg, e.sb.ID, spec, token, vaultEnv)
	if _, err := r.eng.create(context.WithoutCancel(ctx), name, cc, hc, nil); err != nil && !errors.Is(err, errNameConflict) {
		return &failure{"EGRESS_START_FAILED", fmt.Sprintf("the engine refused the egress container: %v", err)}
	}
	return nil
}

// waitEgress polls osb-egress's /healthz until it answers 200 (its rules
// are in force), the container stops, or StartTimeout passes.
func (r *Runtime) waitEgress(ctx context.Context, hostAddr, name string) error {
	url := execdURL(hostAddr) + "/healthz"
	deadline := time.Now().Add(r.cfg.StartTimeout)
	delay := 2 * time.Millisecond
	var last error
	for n := 0; ; n++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := probeClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/healthz answered %s", resp.Status)
		}
		last = err
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return &failure{"EGRESS_NOT_READY", fmt.Sprintf("osb-egress did not enforce the policy within %v (%v)", r.cfg.StartTimeout, last)}
		}
		if n%20 == 19 {
			if info, err := r.eng.inspect(ctx, name); err == nil && info.State != "running" {
				msg := fmt.Sprintf("the egress container stopped (%s, exit code %d) before enforcing the policy", info.State, info.ExitCode)
				if logs, err := r.eng.logs(ctx, name, 20, time.Time{}); err == nil && logs != "" {
					msg += ": " + strings.TrimSpace(logs)
				}
				return &failure{"EGRESS_NOT_READY", msg}
			}
		}
		time.Sleep(delay)
		if n >= 50 {
			delay = min(delay*2, 100*time.Millisecond)
		}
	}
}

// egressEndpoint is the endpoint of the egress API of a sandbox whose
// ports are ports: published from the egress container, under the path
// /proxy/18080 that osb-egress also serves, so that clients which check
// that an endpoint is for the port they asked accept it.
func (r *Runtime) egressEndpoint(ports map[int]string, token string) (sandbox.Endpoint, bool) {
	addr, ok := ports[sandbox.PortEgress]
	if !ok || token == "" {
		return sandbox.Endpoint{}, false
	}
	return sandbox.Endpoint{
		Address: publicAddr(r.cfg.PublicHost, addr) + "/proxy/" + strconv.Itoa(sandbox.PortEgress),
		Headers: map[string]string{api.HeaderEgressAuth: token},
	}, true
}

// restartEgress starts the egress container name again if it stopped, and
// waits until it enforces the policy it kept.
func (r *Runtime) restartEgress(ctx context.Context, name string) error {
	info, err := r.eng.inspect(ctx, name)
	if err != nil {
		return &failure{"EGRESS_START_FAILED", fmt.Sprintf("the egress container %s: %v", name, err)}
	}
	if info.State != "running" {
		if err := r.eng.start(ctx, name); err != nil {
			return &failure{"EGRESS_START_FAILED", fmt.Sprintf("the egress container did not start: %v", err)}
		}
		if info, err = r.eng.inspect(ctx, name); err != nil {
			return &failure{"EGRESS_START_FAILED", fmt.Sprintf("inspect the egress container: %v", err)}
		}
	}
	addr, ok := info.Ports[sandbox.PortEgress]
	if !ok {
		return &failure{"EGRESS_START_FAILED", "the egress API's port was not published"}
	}
	return r.waitEgress(ctx, addr, name)
}

// egressNetworkOK refuses a network policy on a network where a sandbox
// cannot have a namespace of its own for osb-egress to own: the host's,
// none, or another container's.
func egressNetworkOK(network string) error {
	if network == "host" || network == "none" || strings.HasPrefix(network, "container:") {
		return sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter,
			fmt.Sprintf("networkPolicy: sandboxes of this server use the Docker network %q, where no policy can be enforced (use a bridge network)", network))
	}
	return nil
}

// egressDenials are the outbound attempts osb-egress refused most
// recently (its GET /denials), as runtime events: one EGRESS_DENIED per
// attempt. A sandbox without osb-egress, or one whose osb-egress does not
// answer, has none.
func (r *Runtime) egressDenials(ctx context.Context, id sandbox.ID) []sandbox.Event {
	r.mu.Lock()
	e, err := r.getLocked(id)
	var ep sandbox.Endpoint
	ok := false
	if err == nil {
		ep, ok = r.egressEndpoint(e.ports, e.egressToken)
	}
	addr := ""
	if ok {
		addr = e.ports[sandbox.PortEgress]
	}
	r.mu.Unlock()
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, execdURL(addr)+"/denials", nil)
	req.Header.Set(api.HeaderEgressAuth, ep.Headers[api.HeaderEgressAuth])
	resp, err := probeClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var denials []struct {
		Time   time.Time `json:"time"`
		Kind   string    `json:"kind"`
		Name   string    `json:"name"`
		Addr   string    `json:"addr"`
		Port   int       `json:"port"`
		Reason string    `json:"reason"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&denials) != nil {
		return nil
	}
	evs := make([]sandbox.Event, 0, len(denials))
	for _, d := range denials {
		what := d.Name
		if d.Addr != "" {
			dest := d.Addr
			if d.Port != 0 {
				dest = net.JoinHostPort(d.Addr, strconv.Itoa(d.Port))
			}
			what = strings.TrimSpace(what + " " + dest)
		}
		evs = append(evs, sandbox.Event{Time: d.Time, Source: sandbox.SourceRuntime, Type: "EGRESS_DENIED",
			Message: fmt.Sprintf("%s %s: %s", d.Kind, what, d.Reason)})
	}
	return evs
}
