package lifecycle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
	"github.com/opensandbox/opensandbox/internal/hostpath"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Extension keys the server reads.
const (
	extPoolRef       = "poolRef"
	extRenewExtend   = api.ExtensionRenewExtend
	extIngressPublic = api.ExtensionIngressPublic
)

// Bounds of extensions[access.renew.extend.seconds], in seconds.
const (
	minRenewExtend = 300
	maxRenewExtend = 86400
)

// reservedEnv is the variable that hands execd its token; a request may
// not set it.
const reservedEnv = "EXECD_ACCESS_TOKEN"

// snapshotEntrypoint is the main process of a sandbox restored from a
// snapshot without an entrypoint: one that keeps it alive.
var snapshotEntrypoint = []string{"tail", "-f", "/dev/null"}

// maxTimeoutSeconds is the largest timeout a time.Duration can hold.
const maxTimeoutSeconds = math.MaxInt64 / int64(time.Second)

// specFromRequest validates a create request and turns it into the spec
// of the sandbox to make, with ExpiresAt counted from now. Every failure
// is a 400 naming the field, with the reference server's code where it
// has one.
func (s *Server) specFromRequest(req *api.CreateSandboxRequest, now time.Time) (sandbox.Spec, error) {
	var spec sandbox.Spec

	// The reference checks extensions before anything runtime-specific.
	if err := s.checkExtensionKeys(req.Extensions); err != nil {
		return spec, err
	}
	if err := checkExtensions(req.Extensions); err != nil {
		return spec, err
	}
	poolRef := strings.TrimSpace(req.Extensions[extPoolRef])
	if poolRef != "" {
		if _, ok := s.rt.(sandbox.Pooler); !ok {
			return spec, invalid(codeUnsupportedPool, "extensions.poolRef: this server's runtime has no warm pools")
		}
		if strings.TrimSpace(req.SnapshotID) != "" {
			return spec, invalid(codeInvalidParameter, "extensions.poolRef and snapshotId cannot be used together")
		}
		if req.CredentialProxy != nil && req.CredentialProxy.Enabled {
			return spec, invalid(codeInvalidParameter, "credentialProxy cannot be used with extensions.poolRef")
		}
	}
	spec.Extensions = maps.Clone(req.Extensions)

	snapshotID := strings.TrimSpace(req.SnapshotID)
	switch {
	case poolRef != "" && req.Image == nil:
		// Pool mode: the pool's template gives the image.
	case req.Image != nil && snapshotID != "":
		return spec, invalid(codeInvalidParameter, "give exactly one of image and snapshotId, not both")
	case req.Image == nil && snapshotID == "":
		return spec, invalid(codeInvalidParameter, "one of image.uri and snapshotId is required")
	case req.Image != nil:
		if strings.TrimSpace(req.Image.URI) == "" {
			return spec, invalid(codeInvalidParameter, "image.uri must not be blank")
		}
		if err := checkImageRef(req.Image.URI); err != nil {
			return spec, invalid(codeInvalidParameter, "image.uri %q: %v", req.Image.URI, err)
		}
		if err := s.checkRegistry("image.uri", req.Image.URI); err != nil {
			return spec, err
		}
		spec.Image = req.Image.URI
		if a := req.Image.Auth; a != nil {
			spec.ImageAuth = &sandbox.RegistryAuth{Username: a.Username, Password: a.Password}
		}
		if req.Entrypoint == nil && poolRef == "" {
			return spec, invalid(s.codes().invalidEntrypoint, "entrypoint is required with image")
		}
	default:
		spec.SnapshotID = snapshotID
	}

	spec.Entrypoint = slices.Clone(req.Entrypoint)
	if spec.Entrypoint == nil && poolRef == "" {
		spec.Entrypoint = slices.Clone(snapshotEntrypoint)
	}
	if spec.Entrypoint != nil {
		if err := checkEntrypoint(spec.Entrypoint); err != nil {
			return spec, invalid(s.codes().invalidEntrypoint, "entrypoint: %v", err)
		}
	}

	if req.Timeout != nil {
		at, err := s.expiryOf(*req.Timeout, now)
		if err != nil {
			return spec, err
		}
		spec.ExpiresAt = &at
	}

	if req.ResourceLimits == nil && poolRef == "" {
		return spec, invalid(codeInvalidParameter, "resourceLimits is required (for example {\"cpu\":\"1\",\"memory\":\"2Gi\"})")
	}
	if req.ResourceLimits != nil {
		res, err := parseResources(req.ResourceLimits)
		if err != nil {
			return spec, invalid(codeInvalidParameter, "resourceLimits: %v", err)
		}
		spec.Resources = res
	}

	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		v := req.Env[k]
		if v == nil {
			continue // the reference tolerates null values; they set nothing
		}
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(*v, 0) {
			return spec, invalid(codeInvalidParameter, "env %q: names must be non-empty without '=' or NUL, values without NUL", k)
		}
		if k == reservedEnv {
			return spec, invalid(codeInvalidParameter, "env %s is reserved: it carries the sandbox's own access token", k)
		}
		if spec.Env == nil {
			spec.Env = map[string]string{}
		}
		spec.Env[k] = *v
	}
	if err := checkExecSize(spec.Env, spec.Entrypoint); err != nil {
		return spec, err
	}

	for _, k := range slices.Sorted(maps.Keys(req.Metadata)) {
		if err := checkLabel(k, req.Metadata[k]); err != nil {
			return spec, invalid(codeMetadataLabel, "metadata: %v", err)
		}
	}
	spec.Metadata = maps.Clone(req.Metadata)

	if p := req.Platform; p != nil {
		pl := sandbox.Platform{OS: strings.ToLower(strings.TrimSpace(p.OS)), Arch: strings.ToLower(strings.TrimSpace(p.Arch))}
		if pl.OS != "linux" && pl.OS != "windows" {
			return spec, invalid(codeInvalidParameter, "platform.os %q: want linux or windows", p.OS)
		}
		if pl.Arch != "amd64" && pl.Arch != "arm64" {
			return spec, invalid(codeInvalidParameter, "platform.arch %q: want amd64 or arm64", p.Arch)
		}
		spec.Platform = &pl
	}

	policy := len(req.NetworkPolicy) > 0 && !bytes.Equal(bytes.TrimSpace(req.NetworkPolicy), []byte("null"))
	if policy {
		if err := checkNetworkPolicy(req.NetworkPolicy); err != nil {
			return spec, invalid(codeInvalidParameter, "networkPolicy: %v", err)
		}
	}
	if req.CredentialProxy != nil && req.CredentialProxy.Enabled && !policy {
		return spec, invalid(codeInvalidParameter, "credentialProxy.enabled requires a networkPolicy")
	}
	eg := s.cfg.Egress
	if policy && eg == nil {
		return spec, invalid(codeInvalidParameter, "networkPolicy: this server's runtime does not enforce network policies")
	}
	if req.CredentialProxy != nil && req.CredentialProxy.Enabled {
		if eg.Mode != sandbox.EgressStrict {
			return spec, invalid(codeInvalidParameter, "credentialProxy: needs the strict egress mode, and this server enforces %q", eg.Mode)
		}
		spec.CredentialProxy = true
	}
	switch {
	case policy:
		p, err := egress.ParsePolicy(req.NetworkPolicy)
		if err != nil {
			return spec, invalid(codeInvalidParameter, "networkPolicy: %v", err)
		}
		if cap := eg.RuleCap(); cap > 0 && len(p.Egress) > cap {
			return spec, invalid(codeInvalidParameter, "networkPolicy: %d rules, more than this server's cap of %d", len(p.Egress), cap)
		}
		if spec.NetworkPolicy, err = json.Marshal(p.API()); err != nil {
			return spec, fmt.Errorf("networkPolicy: %w", err)
		}
	case eg != nil && eg.DefaultPolicy != "":
		spec.NetworkPolicy = []byte(eg.DefaultPolicy)
	}

	spec.SecureAccess = req.SecureAccess
	if req.SecureAccess && req.Extensions[extIngressPublic] == "true" {
		return spec, invalid(codeInvalidParameter, "secureAccess and extensions[%q] = \"true\" contradict each other: a public sandbox's ports need no token", extIngressPublic)
	}

	vols, err := s.volumes(req.Volumes)
	if err != nil {
		return spec, err
	}
	spec.Volumes = vols
	return spec, nil
}

// expiryOf returns now plus timeout seconds, which must lie within
// MinTimeout and MaxTimeout.
func (s *Server) expiryOf(timeout int64, now time.Time) (time.Time, error) {
	minSec := int64(s.cfg.MinTimeout / time.Second)
	maxSec := maxTimeoutSeconds
	if s.cfg.MaxTimeout > 0 {
		maxSec = int64(s.cfg.MaxTimeout / time.Second)
	}
	if timeout < minSec {
		return time.Time{}, invalid(codeInvalidParameter, "timeout %d: must be at least %d seconds (or null for no automatic expiry)", timeout, minSec)
	}
	if timeout > maxSec {
		return time.Time{}, invalid(codeInvalidParameter, "timeout %d: must be at most %d seconds", timeout, maxSec)
	}
	return now.Add(time.Duration(timeout) * time.Second).UTC(), nil
}

// checkExtensions checks the extension keys the server knows.
func checkExtensions(ext map[string]string) error {
	if v, ok := ext[extRenewExtend]; ok {
		if _, err := renewExtendOf(v); err != nil {
			return invalid(codeInvalidParameter, "extensions[%q] %q: %v", extRenewExtend, v, err)
		}
	}
	if v, ok := ext[extIngressPublic]; ok && v != "true" && v != "false" {
		return invalid(codeInvalidParameter, "extensions[%q] %q: want \"true\" or \"false\"", extIngressPublic, v)
	}
	return nil
}

// renewExtendOf parses extensions[access.renew.extend.seconds]: a decimal
// integer of seconds from 300 to 86400.
func renewExtendOf(v string) (time.Duration, error) {
	if len(v) == 0 || len(v) > 6 || strings.Trim(v, "0123456789") != "" {
		return 0, fmt.Errorf("want a whole number of seconds from %d to %d", minRenewExtend, maxRenewExtend)
	}
	n, _ := strconv.Atoi(v)
	if n < minRenewExtend || n > maxRenewExtend {
		return 0, fmt.Errorf("want a whole number of seconds from %d to %d", minRenewExtend, maxRenewExtend)
	}
	return time.Duration(n) * time.Second, nil
}

// checkEntrypoint requires a non-blank program and no NUL byte, which no
// argv can carry.
func checkEntrypoint(argv []string) error {
	if len(argv) == 0 {
		return errors.New("must name a program: [program, arg, ...]")
	}
	if strings.TrimSpace(argv[0]) == "" {
		return errors.New("the program (entrypoint[0]) must not be blank")
	}
	for i, a := range argv {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("entrypoint[%d] contains a NUL byte", i)
		}
	}
	return nil
}

// Image references, after the grammar of the distribution project's
// reference package (what the Docker engine accepts): an optional
// registry host[:port], lower-case path components, an optional tag and
// an optional digest.
var (
	imageRefRE = func() *regexp.Regexp {
		const (
			alnum      = `[a-z0-9]+`
			separator  = `(?:[._]|__|[-]+)`
			component  = alnum + `(?:` + separator + alnum + `)*`
			domainPart = `(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])`
			host       = `(?:` + domainPart + `(?:\.` + domainPart + `)*|\[[a-fA-F0-9:]+\])`
			domain     = host + `(?::[0-9]+)?`
			name       = `(?:` + domain + `/)?` + component + `(?:/` + component + `)*`
			tag        = `[\w][\w.-]{0,127}`
			digest     = `[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}`
		)
		return regexp.MustCompile(`^(` + name + `)(?::` + tag + `)?(?:@` + digest + `)?$`)
	}()
	hex64RE = regexp.MustCompile(`^[a-f0-9]{64}$`)
)

// checkImageRef reports whether ref is an image reference the engine can
// pull: "python:3.11", "registry.local:5000/team/app@sha256:...".
func checkImageRef(ref string) error {
	if len(ref) > 4096 {
		return errors.New("too long")
	}
	m := imageRefRE.FindStringSubmatch(ref)
	if m == nil {
		return errors.New("not an image reference (want [registry/]name[:tag][@digest], the name in lower case)")
	}
	if len(m[1]) > 255 {
		return errors.New("repository name longer than 255 characters")
	}
	if hex64RE.MatchString(m[1]) {
		return errors.New("a 64-digit hexadecimal string is an image id, not a repository name")
	}
	return nil
}

// Label rules (lifecycle.md §9.1), as Kubernetes labels.
var (
	labelNameRE   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelPrefixRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	dnsLabelRE    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// reservedLabelPrefix is the key prefix the server keeps for itself.
const reservedLabelPrefix = "opensandbox.io/"

// checkLabelKey checks a metadata key: an optional DNS-subdomain prefix
// and "/", then a name of at most 63 characters; never the reserved
// opensandbox.io/ prefix.
func checkLabelKey(k string) error {
	if strings.HasPrefix(k, reservedLabelPrefix) {
		return fmt.Errorf("key %q: the prefix %s is reserved", k, reservedLabelPrefix)
	}
	name := k
	if prefix, rest, ok := strings.Cut(k, "/"); ok {
		if len(prefix) > 253 || !labelPrefixRE.MatchString(prefix) {
			return fmt.Errorf("key %q: the prefix must be a DNS subdomain of at most 253 characters", k)
		}
		name = rest
	}
	if len(name) > 63 || !labelNameRE.MatchString(name) {
		return fmt.Errorf("key %q: the name must be 1-63 characters [A-Za-z0-9-_.], starting and ending alphanumeric", k)
	}
	return nil
}

// checkLabelValue checks a metadata value: empty, or at most 63
// characters [A-Za-z0-9-_.] starting and ending alphanumeric.
func checkLabelValue(v string) error {
	if v != "" && (len(v) > 63 || !labelNameRE.MatchString(v)) {
		return fmt.Errorf("value %q: must be empty or 1-63 characters [A-Za-z0-9-_.], starting and ending alphanumeric", v)
	}
	return nil
}

// checkLabel checks a metadata entry.
func checkLabel(k, v string) error {
	if err := checkLabelKey(k); err != nil {
		return err
	}
	if err := checkLabelValue(v); err != nil {
		return fmt.Errorf("key %q: %w", k, err)
	}
	return nil
}

// Resource quantities besides CPU and memory (see sandbox.ParseCPU).
var (
	storageRE = regexp.MustCompile(`^\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|Ei)?$`)
	gpuRE     = regexp.MustCompile(`^[0-9]{1,4}$`)
)

// parseResources reads resourceLimits: cpu ("500m", "2", "0.5"), memory
// ("512Mi", "2Gi", "1G", "1000000" bytes), gpu ("1", "all") and
// ephemeral-storage (the disk the sandbox may fill, written as memory is;
// Kubernetes' name, which existing clients send). Any other key is an
// error naming it.
func parseResources(limits map[string]string) (sandbox.Resources, error) {
	var res sandbox.Resources
	for _, k := range slices.Sorted(maps.Keys(limits)) {
		v := strings.TrimSpace(limits[k])
		switch k {
		case "cpu":
			n, err := sandbox.ParseCPU(v)
			if err != nil {
				return res, err
			}
			res.CPUMillis = n
		case "memory":
			n, err := sandbox.ParseMemory(v)
			if err != nil {
				return res, err
			}
			res.MemoryBytes = n
		case "ephemeral-storage":
			n, err := sandbox.ParseStorage(v)
			if err != nil {
				return res, err
			}
			res.StorageBytes = n
		case "gpu":
			switch {
			case strings.EqualFold(v, "all"):
				res.GPUs = "all"
			case gpuRE.MatchString(v):
				if n, _ := strconv.Atoi(v); n > 0 {
					res.GPUs = strconv.Itoa(n)
				}
			default:
				return res, fmt.Errorf("gpu %q: want a count (\"1\") or \"all\"", v)
			}
		default:
			return res, fmt.Errorf("unsupported key %q (supported: cpu, memory, gpu, ephemeral-storage)", k)
		}
	}
	return res, nil
}

// checkNetworkPolicy checks the shape of a network policy, so that a
// malformed one gets a precise message.
func checkNetworkPolicy(raw json.RawMessage) error {
	var p api.NetworkPolicy
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if p.DefaultAction != "" && p.DefaultAction != "allow" && p.DefaultAction != "deny" {
		return fmt.Errorf("defaultAction %q: want allow or deny", p.DefaultAction)
	}
	for i, rule := range p.Egress {
		if rule.Action != "allow" && rule.Action != "deny" {
			return fmt.Errorf("egress[%d].action %q: want allow or deny", i, rule.Action)
		}
		if strings.TrimSpace(rule.Target) == "" {
			return fmt.Errorf("egress[%d].target: required", i)
		}
	}
	return nil
}

// volumes validates the volumes of a create request (lifecycle.md §11)
// and returns them as the runtime mounts them.
func (s *Server) volumes(in []api.Volume) ([]sandbox.Volume, error) {
	var out []sandbox.Volume
	names := map[string]bool{}
	mounts := map[string]bool{}
	for i, v := range in {
		field := fmt.Sprintf("volumes[%d]", i)
		if len(v.Name) > 63 || !dnsLabelRE.MatchString(v.Name) {
			return nil, invalid(codeVolumeName, "%s.name %q: want a DNS label (lower-case letters, digits and '-', at most 63)", field, v.Name)
		}
		if names[v.Name] {
			return nil, invalid(codeVolumeDuplicate, "%s.name %q: used by another volume", field, v.Name)
		}
		names[v.Name] = true
		if !strings.HasPrefix(v.MountPath, "/") || strings.ContainsRune(v.MountPath, 0) {
			return nil, invalid(codeVolumeMountPath, "%s.mountPath %q: want an absolute path", field, v.MountPath)
		}
		mount := path.Clean(v.MountPath)
		if why := reservedMount(mount); why != "" {
			return nil, invalid(codeVolumeMountPath, "%s.mountPath %q: %s", field, v.MountPath, why)
		}
		if mounts[mount] {
			return nil, invalid(codeVolumeMountPath, "%s.mountPath %q: another volume is mounted there", field, v.MountPath)
		}
		mounts[mount] = true
		sub, err := cleanSubPath(v.SubPath)
		if err != nil {
			return nil, invalid(codeVolumeSubPath, "%s.subPath %q: %v", field, v.SubPath, err)
		}
		vol := sandbox.Volume{Name: v.Name, MountPath: mount, ReadOnly: v.ReadOnly, SubPath: sub}

		n := 0
		for _, set := range []bool{v.Host != nil, v.PVC != nil, v.OSSFS != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			return nil, invalid(codeVolumeBackend, "%s: give exactly one of host, pvc and ossfs", field)
		}
		switch {
		case v.Host != nil:
			p, err := s.checkHostPath(field+".host.path", v.Host.Path, sub)
			if err != nil {
				return nil, err
			}
			// The runtime mounts the path as resolved here, and checks
			// that no symlink appeared in it since; or, on other machines,
			// the path as written.
			vol.HostPath, vol.SubPath = p, ""
			vol.HostPathAsWritten = filepath.Join(filepath.Clean(v.Host.Path), sub)
		case v.PVC != nil:
			c := v.PVC
			if len(c.ClaimName) > 253 || !dnsLabelRE.MatchString(c.ClaimName) {
				return nil, invalid(codeVolumePVCName, "%s.pvc.claimName %q: want lower-case letters, digits and '-', at most 253", field, c.ClaimName)
			}
			claim := &sandbox.Claim{Name: c.ClaimName, CreateIfNotExists: true, DeleteOnTermination: c.DeleteOnSandboxTermination}
			if c.CreateIfNotExists != nil {
				claim.CreateIfNotExists = *c.CreateIfNotExists
			}
			if c.StorageClass != nil {
				claim.StorageClass = *c.StorageClass
			}
			if c.Storage != nil {
				if !storageRE.MatchString(*c.Storage) || len(*c.Storage) > 64 {
					return nil, invalid(codeInvalidParameter, "%s.pvc.storage %q: want a size such as 1Gi or 500Mi", field, *c.Storage)
				}
				claim.Size = *c.Storage
			}
			for j, m := range c.AccessModes {
				switch m {
				case "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod":
				default:
					return nil, invalid(codeInvalidParameter, "%s.pvc.accessModes[%d] %q: want ReadWriteOnce, ReadOnlyMany, ReadWriteMany or ReadWriteOncePod", field, j, m)
				}
			}
			claim.AccessModes = slices.Clone(c.AccessModes)
			vol.Claim = claim
		default:
			return nil, invalid(codeVolumeUnsupported, "%s: ossfs volumes are not supported by this server", field)
		}
		out = append(out, vol)
	}
	return out, nil
}

// cleanSubPath checks a subPath: relative, without "..", and returns it
// cleaned ("" for the volume's root).
func cleanSubPath(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	if strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		return "", errors.New("want a relative path")
	}
	if slices.Contains(strings.Split(p, "/"), "..") {
		return "", errors.New("must not contain '..'")
	}
	c := path.Clean(p)
	if c == "." {
		return "", nil
	}
	return c, nil
}

// engineSockets are the Docker engine's sockets, which no sandbox may
// mount, nor any directory that contains them.
var engineSockets = []string{"/var/run/docker.sock", "/run/docker.sock"}

// engineDirs hold what drives the container engines and the kubelet on a
// host: containerd's socket and shims (/run/docker/containerd,
// /run/containerd), runtimes' state, the engines' stores (each container's
// writable layer, every volume) and their configuration. A sandbox given
// any of them, or a directory above or inside one, could drive the host's
// containers or change how the engine starts them.
var engineDirs = []string{
	"/run/docker", "/var/run/docker", "/run/containerd", "/var/run/containerd",
	"/run/runc", "/run/crio", "/var/run/crio", "/run/podman",
	"/var/lib/docker", "/var/lib/containerd", "/var/lib/containers", "/var/lib/kubelet",
	"/etc/docker", "/etc/containerd", "/etc/kubernetes",
}

// hostAllowlist cleans the host-volume allow-list and resolves its
// entries' symbolic links, once: entries resolved again on every request
// could be redirected by a sandbox that writes where one of them leads.
// For the same reason no entry may lie inside another, as written or
// resolved: the outer one's sandboxes could swap a directory on the way
// to the inner one for a link.
func hostAllowlist(entries []string) (allow, resolved []string, err error) {
	for _, p := range entries {
		if !filepath.IsAbs(p) {
			return nil, nil, fmt.Errorf("host path allow-list: %q is not absolute", p)
		}
		c := filepath.Clean(p)
		if slices.Contains(allow, c) {
			continue
		}
		r, err := hostpath.Resolve(c)
		if err != nil {
			return nil, nil, fmt.Errorf("host path allow-list: %q: %w", p, err)
		}
		allow, resolved = append(allow, c), append(resolved, r)
	}
	for i := range allow {
		for j := range allow {
			if i == j {
				continue
			}
			// Two spellings of one directory (/var/run and /run) are
			// fine: the link between them lies outside both.
			if hostpath.Within(allow[i], allow[j]) || (hostpath.Within(resolved[i], resolved[j]) && resolved[i] != resolved[j]) {
				return nil, nil, fmt.Errorf("host path allow-list: %s lies inside %s (resolved: %s in %s); list only the outer one, whose sandboxes could otherwise redirect the inner one",
					allow[i], allow[j], resolved[i], resolved[j])
			}
		}
	}
	return allow, resolved, nil
}

// checkHostPath allows host path p (mounted at its subdirectory sub) only
// if p and p/sub lie under an allow-list entry, both as written (cleaned)
// and with every symlink resolved (the entries' as resolved at start), and
// neither is, nor contains, the Docker socket. It returns p/sub with every
// symlink resolved, which the runtime mounts only if it still has no link
// in it; field names p in messages.
func (s *Server) checkHostPath(field, p, sub string) (string, error) {
	if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		return "", invalid(codeVolumeHostPath, "%s %q: want an absolute path on this host", field, p)
	}
	if len(s.allow) == 0 {
		return "", invalid(codeVolumeNotAllowed, "%s %q: host volumes are not allowed on this server", field, p)
	}
	clean := filepath.Clean(p)
	lexical := []string{clean, filepath.Join(clean, sub)}
	var resolved []string
	for _, c := range lexical {
		r, err := hostpath.Resolve(c)
		if err != nil {
			return "", invalid(codeVolumeHostPath, "%s %q: %v", field, p, err)
		}
		resolved = append(resolved, r)
	}

	// The host's root holds everything, the engine's socket and this
	// server's keys included: say so rather than name the socket.
	for i, c := range slices.Concat(lexical, resolved) {
		if c == "/" {
			what, how := p, "is"
			if i%2 == 1 {
				what = filepath.Join(p, sub)
			}
			if i >= len(lexical) {
				how = "leads (through symlinks) to"
			}
			return "", invalid(codeVolumeNotAllowed, "%s %q %s /, the host's root directory, which no sandbox may mount", field, what, how)
		}
	}

	withResolved := func(paths []string) []string {
		out := slices.Clone(paths)
		for _, q := range paths {
			if r, err := hostpath.Resolve(q); err == nil && r != q {
				out = append(out, r)
			}
		}
		return out
	}
	sockets, dirs := withResolved(engineSockets), withResolved(engineDirs)
	for _, c := range slices.Concat(lexical, resolved) {
		for _, sock := range sockets {
			if hostpath.Within(sock, c) {
				return "", invalid(codeVolumeNotAllowed, "%s %q: the Docker socket may not be mounted", field, p)
			}
		}
		for _, d := range dirs {
			if hostpath.Within(c, d) || hostpath.Within(d, c) {
				return "", invalid(codeVolumeNotAllowed, "%s %q: %s drives the host's container engine and may not be mounted, nor anything above or inside it", field, p, d)
			}
		}
	}

	allowResolved := s.allowResolved
	// Each path must stay within the entry it is written under: a link
	// in one entry may not lead into another, whose sandboxes are not
	// this one's to reach (a sandbox of one entry can plant such links).
	for i, c := range lexical {
		entry := slices.IndexFunc(s.allow, func(d string) bool { return hostpath.Within(c, d) })
		if entry < 0 {
			return "", invalid(codeVolumeNotAllowed, "%s %q is not under an allowed host path (%s)", field, p, strings.Join(s.allow, ", "))
		}
		if r := resolved[i]; !hostpath.Within(r, allowResolved[entry]) {
			return "", invalid(codeVolumeNotAllowed, "%s %q leads (through symlinks) to %s, which is not under the allowed host path %s it is written under", field, p, r, s.allow[entry])
		}
	}
	return resolved[1], nil
}
