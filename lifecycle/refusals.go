package lifecycle

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/opensandbox/opensandbox/internal/hostpath"
	"github.com/opensandbox/opensandbox/sandbox"
)

// This file holds the checks that refuse, at create, what a sandbox would
// not get: an extension nobody reads, more than the host has, a mount
// over the kernel's file systems or execd, an environment the kernel
// would not pass, a registry on the server's own machine. Each answers a
// 400 saying what and why, instead of a 202 for a sandbox that then
// fails or runs without what it asked for.

// serverExtensions are the extension keys the server itself reads.
var serverExtensions = []string{extPoolRef, extRenewExtend, extIngressPublic}

// knownExtensions returns the extension keys a create may carry: the
// server's, the runtime's, and those the operator allows (an entry
// ending in "*" allowing every key with its prefix).
func (s *Server) knownExtensions() (exact map[string]bool, prefixes []string) {
	exact = map[string]bool{}
	for _, k := range serverExtensions {
		exact[k] = true
	}
	var keys []string
	if er, ok := s.rt.(sandbox.ExtensionReader); ok {
		keys = er.ExtensionKeys()
	}
	for _, k := range slices.Concat(keys, s.cfg.AllowedExtensions) {
		if p, ok := strings.CutSuffix(k, "*"); ok {
			prefixes = append(prefixes, p)
		} else {
			exact[k] = true
		}
	}
	return exact, prefixes
}

// checkExtensionKeys refuses extension keys that neither the server nor
// its runtime reads and the operator has not allowed: a runtime would
// silently ignore them ("docker.privileged": "true" would be a 202 for a
// sandbox that is not privileged).
func (s *Server) checkExtensionKeys(ext map[string]string) error {
	exact, prefixes := s.knownExtensions()
	var unknown []string
	for _, k := range slices.Sorted(maps.Keys(ext)) {
		if exact[k] || slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(k, p) }) {
			continue
		}
		unknown = append(unknown, strconv.Quote(k))
	}
	if len(unknown) == 0 {
		return nil
	}
	noun := "key"
	if len(unknown) > 1 {
		noun = "keys"
	}
	read := slices.Sorted(maps.Keys(exact))
	for _, p := range prefixes {
		read = append(read, p+"*")
	}
	return invalid(codeInvalidParameter, "extensions: unknown %s %s: this server takes only %s (an operator can let other keys through with server.allowed_extensions)",
		noun, strings.Join(unknown, ", "), strings.Join(read, ", "))
}

// execdDir is where execd lives in every sandbox: the Docker runtime
// mounts it at /opt/opensandbox/bin/execd, the Kubernetes runtime mounts
// a volume at /opt/opensandbox/bin.
const execdDir = "/opt/opensandbox"

// reservedMounts are the directories no volume may be mounted on, under,
// or above, with why.
var reservedMounts = []struct{ dir, what string }{
	{"/proc", "the kernel's process file system"},
	{"/sys", "the kernel's sysfs"},
	{"/dev", "the sandbox's device directory"},
	{execdDir, "execd's own directory, which every sandbox needs"},
}

// reservedMount says why a volume may not be mounted at clean absolute
// path p, or "" if it may: "/" would hide the image, a path on or under
// /proc, /sys, /dev or execd's directory would replace or shadow what
// the sandbox runs on, and a path above them (/opt) would hide them.
func reservedMount(p string) string {
	if p == "/" {
		return "mounting over / would hide the whole image"
	}
	for _, r := range reservedMounts {
		switch {
		case p == r.dir:
			return fmt.Sprintf("%s is %s", r.dir, r.what)
		case hostpath.Within(p, r.dir):
			return fmt.Sprintf("%s lies in %s, %s", p, r.dir, r.what)
		case hostpath.Within(r.dir, p):
			return fmt.Sprintf("a volume at %s would hide %s, %s", p, r.dir, r.what)
		}
	}
	return ""
}

// Limits of what execve(2) takes. maxArgStrlen is MAX_ARG_STRLEN (32
// pages of 4 KiB): the most one argument or one "NAME=value" may hold,
// its terminating NUL included. execArgMax is what a sandbox's exec takes
// of arguments and environment together, pointers included: a quarter of
// the stack limit, 2 MiB under the usual 8 MiB (Docker's and the
// kubelet's default). execReserve of it is kept for what the request
// does not say: the image's own environment and execd's.
const (
	maxArgStrlen = 32 * 4096
	execArgMax   = 2 << 20
	execReserve  = 64 << 10
)

// checkExecSize refuses an environment or an entrypoint the kernel would
// not pass to the sandbox's processes: execve fails with E2BIG, so the
// sandbox would never start, or every command in it would fail.
func checkExecSize(env map[string]string, entrypoint []string) error {
	total := 0
	for _, k := range slices.Sorted(maps.Keys(env)) {
		n := len(k) + 1 + len(env[k]) + 1
		if n > maxArgStrlen {
			return invalid(codeInvalidParameter, "env %s: %d bytes as %s=VALUE, over the kernel's limit for one variable, %d bytes (MAX_ARG_STRLEN, 128 KiB, the terminating NUL included)",
				k, n-1, k, maxArgStrlen-1)
		}
		total += n + 8
	}
	for i, a := range entrypoint {
		n := len(a) + 1
		if n > maxArgStrlen {
			return invalid(codeInvalidParameter, "entrypoint[%d]: %d bytes, over the kernel's limit for one argument, %d bytes (MAX_ARG_STRLEN, 128 KiB, the terminating NUL included)",
				i, n-1, maxArgStrlen-1)
		}
		total += n + 8
	}
	if budget := execArgMax - execReserve; total > budget {
		return invalid(codeInvalidParameter, "env and entrypoint: %d bytes together (with the kernel's NUL and pointer per string), over the %d bytes a sandbox's exec may take (ARG_MAX as execve sees it with an 8 MiB stack: 2 MiB, less %d KiB kept for the image's environment and execd's)",
			total, budget, execReserve>>10)
	}
	return nil
}

// localRegistry says why image reference ref names a registry on the
// server's machine or its link: loopback (127.0.0.0/8, ::1, localhost),
// unspecified (0.0.0.0, ::) or link-local (169.254.0.0/16, where cloud
// metadata services answer, fe80::/10), in any spelling an address
// parser would accept (IPv4-mapped IPv6, "127.1", "2130706433",
// "0x7f.0.0.1"), or a loopback name (loopbackNames, this machine's host
// name). It returns "" otherwise. Names are never resolved: a name is
// judged by its spelling only, so one that only DNS or a custom
// /etc/hosts entry points at this machine is not caught.
func localRegistry(ref string) string {
	host, ok := registryHost(ref)
	if !ok {
		return ""
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if loopbackNames[name] || strings.HasSuffix(name, ".localhost") {
		return fmt.Sprintf("%s is a name of this machine's loopback", host)
	}
	if self, err := os.Hostname(); err == nil && self != "" {
		short, _, _ := strings.Cut(strings.ToLower(self), ".")
		if name == strings.ToLower(self) || name == short {
			return fmt.Sprintf("%s is this machine's own host name", host)
		}
	}
	var addr netip.Addr
	if strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") {
		a, err := netip.ParseAddr(name[1 : len(name)-1])
		if err != nil {
			return ""
		}
		addr = a.Unmap()
	} else if a, ok := parseInetAton(name); ok {
		addr = a
	} else {
		return ""
	}
	switch {
	case addr.IsLoopback():
		return fmt.Sprintf("%s is a loopback address (%s)", host, addr)
	case addr.IsUnspecified() || (addr.Is4() && addr.As4()[0] == 0):
		return fmt.Sprintf("%s is an unspecified address (%s), which reaches this machine", host, addr)
	case addr.IsLinkLocalUnicast():
		return fmt.Sprintf("%s is a link-local address (%s), where cloud metadata services answer", host, addr)
	}
	return ""
}

// loopbackNames are the names that mean this machine's loopback: by
// definition (localhost, RFC 6761), or in the /etc/hosts that Debian,
// Ubuntu, Fedora and RHEL install. The machine's own host name, which
// Debian maps to 127.0.1.1, is refused too.
var loopbackNames = map[string]bool{
	"localhost": true, "localhost.localdomain": true, "localhost4": true, "localhost4.localdomain4": true,
	"localhost6": true, "localhost6.localdomain6": true, "ip6-localhost": true, "ip6-loopback": true,
}

// registryHost returns the registry part of an image reference, host and
// port, as the engine splits it: the first path component when it has a
// "." or ":", is "localhost", or has upper-case letters; none (Docker
// Hub) otherwise.
func registryHost(ref string) (string, bool) {
	first, _, ok := strings.Cut(ref, "/")
	if !ok {
		return "", false
	}
	if !strings.ContainsAny(first, ".:") && first != "localhost" && strings.ToLower(first) == first {
		return "", false
	}
	host := first
	if strings.HasPrefix(first, "[") {
		if i := strings.Index(first, "]"); i > 0 {
			host = first[:i+1]
		}
	} else if h, _, ok := strings.Cut(first, ":"); ok {
		host = h
	}
	return host, true
}

// parseInetAton parses s as inet_aton(3) does, which resolvers apply to a
// name before looking it up: one to four parts, each decimal, octal
// (leading 0) or hexadecimal (0x), the last filling the remaining bytes
// ("127.1" is 127.0.0.1, "2130706433" too).
func parseInetAton(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		base, digits := 10, p
		switch {
		case strings.HasPrefix(p, "0x"):
			base, digits = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		if digits == "" && base != 16 {
			return netip.Addr{}, false
		}
		if digits == "" {
			vals[i] = 0 // "0x" alone is 0 to inet_aton
			continue
		}
		v, err := strconv.ParseUint(digits, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	last := len(vals) - 1
	for _, v := range vals[:last] {
		if v > 0xff {
			return netip.Addr{}, false
		}
	}
	if vals[last] > (uint64(1)<<(8*(4-last)))-1 {
		return netip.Addr{}, false
	}
	n := vals[last]
	for i, v := range vals[:last] {
		n |= v << (8 * (3 - i))
	}
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

// checkRegistry refuses an image on a registry on the server's machine or
// its link, unless the operator allows local registries: the engine
// pulls as the host, so such a reference would make it send requests to
// services listening on the host's loopback (this server's API among
// them) or to a cloud metadata service.
func (s *Server) checkRegistry(field, ref string) error {
	if s.cfg.AllowLocalRegistries {
		return nil
	}
	if why := localRegistry(ref); why != "" {
		return invalid(codeInvalidParameter, "%s %q: %s; images are not pulled from this machine's own or link-local registries unless the operator sets server.allow_local_registries", field, ref, why)
	}
	return nil
}

// checkHostSize refuses resources the runtime's largest machine does not
// have. A runtime that cannot tell, or fails to, is not second-guessed.
func (s *Server) checkHostSize(ctx context.Context, field string, res sandbox.Resources) error {
	hs, ok := s.rt.(sandbox.HostSizer)
	if !ok || res == (sandbox.Resources{}) {
		return nil
	}
	size, err := hs.HostSize(ctx)
	if err != nil {
		s.log.Warn("host size unknown: create not checked against it", logErr, err)
		return nil
	}
	return fitsHost(field, res, size)
}

// fitsHost checks resources against a host size: CPU and memory at most
// the host's (where known), a GPU only where the host has one, and no
// more than it has.
func fitsHost(field string, res sandbox.Resources, h sandbox.HostSize) error {
	where := cmp.Or(h.Where, "the runtime's host")
	if h.CPUMillis > 0 && res.CPUMillis > h.CPUMillis {
		return invalid(codeInvalidParameter, "%s.cpu: %s CPUs asked, more than %s has (%s)", field, millis(res.CPUMillis), where, millis(h.CPUMillis))
	}
	if h.MemoryBytes > 0 && res.MemoryBytes > h.MemoryBytes {
		return invalid(codeInvalidParameter, "%s.memory: %s asked, more than %s has (%s)", field, formatBytes(res.MemoryBytes), where, approxBytes(h.MemoryBytes))
	}
	if res.GPUs == "" || !h.GPUsKnown {
		return nil
	}
	if h.GPUs == 0 {
		return invalid(codeInvalidParameter, "%s.gpu %q: %s has no GPU", field, res.GPUs, where)
	}
	if n, err := strconv.ParseInt(res.GPUs, 10, 64); err == nil && n > h.GPUs {
		return invalid(codeInvalidParameter, "%s.gpu: %d GPUs asked, more than %s has (%d)", field, n, where, h.GPUs)
	}
	return nil
}

// approxBytes writes a machine's memory as people read it: exact when
// it is a whole number of Ki, Mi or Gi below a Gi, else in Gi to a tenth
// ("23.5Gi").
func approxBytes(n int64) string {
	if n < 1<<30 || n%(1<<30) == 0 {
		return formatBytes(n)
	}
	return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + "Gi"
}

// millis writes thousandths of a CPU as CPUs: 1500 is "1.5".
func millis(m int64) string {
	return strconv.FormatFloat(float64(m)/1000, 'f', -1, 64)
}
