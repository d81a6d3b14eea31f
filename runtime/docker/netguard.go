package docker

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
)

// netGuard keeps sandboxes from reaching addresses they must never reach,
// cloud metadata services first (169.254.169.254 and the rest of the
// link-local range, Alibaba Cloud's 100.100.100.200): credentials of the
// host's cloud identity live there. The rules sit in the host's firewall,
// out of the sandbox's reach (it holds no NET_ADMIN), in a chain of their
// own that both forwarded traffic (DOCKER-USER, or FORWARD) and traffic
// to the host itself (INPUT) pass through.
type netGuard struct {
	subnets []string
	blocked []string
}

// guardChain is the firewall chain the guard owns.
const guardChain = "OPENSANDBOX-GUARD"

// guardMu serializes the guard's firewall changes within this process
// (several runtimes in one test binary); iptables -w serializes them
// between processes.
var guardMu sync.Mutex

func newNetGuard(ctx context.Context, eng *engine, cfg Config) (*netGuard, error) {
	subnets, err := eng.networkSubnets(ctx, cfg.Network)
	if err != nil {
		return nil, err
	}
	var blocked []string
	if *cfg.BlockMetadata {
		blocked = append(blocked, metadataCIDRs...)
	}
	for _, c := range cfg.BlockedCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			if a, aerr := netip.ParseAddr(c); aerr == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			} else {
				return nil, fmt.Errorf("runtime.docker.blocked_cidrs: %q: %w", c, err)
			}
		}
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("runtime.docker.blocked_cidrs: %q: only IPv4 ranges are supported", c)
		}
		blocked = append(blocked, p.Masked().String())
	}
	g := &netGuard{subnets: subnets, blocked: blocked}
	if err := g.install(ctx); err != nil {
		return nil, fmt.Errorf("install the sandbox network guard (set runtime.docker.block_metadata = false to run without it): %w", err)
	}
	return g, nil
}

func iptables(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "iptables", append([]string{"-w", "5"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// install makes sure the guard chain exists, holds exactly the rules of
// this guard (added, never removing rules other guards added for other
// networks), and is jumped to from INPUT and from forwarded traffic.
func (g *netGuard) install(ctx context.Context) error {
	guardMu.Lock()
	defer guardMu.Unlock()
	if _, err := iptables(ctx, "-n", "-L", guardChain); err != nil {
		if _, err := iptables(ctx, "-N", guardChain); err != nil {
			return err
		}
	}
	for _, s := range g.subnets {
		for _, d := range g.blocked {
			rule := []string{"-s", s, "-d", d, "-j", "REJECT"}
			if _, err := iptables(ctx, append([]string{"-C", guardChain}, rule...)...); err != nil {
				if _, err := iptables(ctx, append([]string{"-A", guardChain}, rule...)...); err != nil {
					return err
				}
			}
		}
	}
	forward := "DOCKER-USER"
	if _, err := iptables(ctx, "-n", "-L", forward); err != nil {
		forward = "FORWARD"
	}
	for _, chain := range []string{forward, "INPUT"} {
		if _, err := iptables(ctx, "-C", chain, "-j", guardChain); err != nil {
			if _, err := iptables(ctx, "-I", chain, "1", "-j", guardChain); err != nil {
				return err
			}
		}
	}
	return nil
}
