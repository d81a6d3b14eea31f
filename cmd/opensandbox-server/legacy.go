package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/runtime/docker"
)

// The configuration file of the existing (Python) OpenSandbox server, as
// its example.config.toml and example.config.k8s.toml spell it, is read
// too: it is converted into this server's format (convertLegacy) and the
// result is loaded as any other file. docs/configuration.md has the
// table of the mapping.

// legacyConfig is that file. Pointers tell a key that is absent from one
// set to its zero value where the two mean different things.
type legacyConfig struct {
	Server struct {
		Host                     string `toml:"host"`
		Port                     *int   `toml:"port"`
		APIKey                   string `toml:"api_key"`
		EIP                      string `toml:"eip"`
		MaxSandboxTimeoutSeconds *int64 `toml:"max_sandbox_timeout_seconds"`
		LogLevel                 string `toml:"log_level"`
		TimeoutKeepAlive         int64  `toml:"timeout_keep_alive"`
	} `toml:"server"`
	Log struct {
		Level           string `toml:"level"`
		FileEnabled     bool   `toml:"file_enabled"`
		FilePath        string `toml:"file_path"`
		AccessFilePath  string `toml:"access_file_path"`
		FileMaxBytes    int64  `toml:"file_max_bytes"`
		FileBackupCount int64  `toml:"file_backup_count"`
	} `toml:"log"`
	RenewIntent struct {
		Enabled            bool  `toml:"enabled"`
		MinIntervalSeconds int64 `toml:"min_interval_seconds"`
		Redis              struct {
			Enabled             bool   `toml:"enabled"`
			DSN                 string `toml:"dsn"`
			QueueKey            string `toml:"queue_key"`
			ConsumerConcurrency int64  `toml:"consumer_concurrency"`
		} `toml:"redis"`
	} `toml:"renew_intent"`
	Runtime struct {
		Type       string `toml:"type"`
		ExecdImage string `toml:"execd_image"`
	} `toml:"runtime"`
	Storage struct {
		AllowedHostPaths  []string `toml:"allowed_host_paths"`
		VolumeDefaultSize string   `toml:"volume_default_size"`
		OSSFSMountRoot    string   `toml:"ossfs_mount_root"`
	} `toml:"storage"`
	Docker struct {
		NetworkMode      string   `toml:"network_mode"`
		APITimeout       int64    `toml:"api_timeout"`
		HostIP           string   `toml:"host_ip"`
		DropCapabilities []string `toml:"drop_capabilities"`
		NoNewPrivileges  *bool    `toml:"no_new_privileges"`
		ApparmorProfile  string   `toml:"apparmor_profile"`
		SeccompProfile   string   `toml:"seccomp_profile"`
		PidsLimit        *int64   `toml:"pids_limit"`
	} `toml:"docker"`
	Kubernetes struct {
		KubeconfigPath                   string                       `toml:"kubeconfig_path"`
		Namespace                        string                       `toml:"namespace"`
		ServiceAccount                   string                       `toml:"service_account"`
		ImagePullPolicy                  string                       `toml:"image_pull_policy"`
		InformerEnabled                  bool                         `toml:"informer_enabled"`
		InformerResyncSeconds            int64                        `toml:"informer_resync_seconds"`
		InformerWatchTimeoutSeconds      int64                        `toml:"informer_watch_timeout_seconds"`
		ReadQPS                          float64                      `toml:"read_qps"`
		ReadBurst                        int64                        `toml:"read_burst"`
		WriteQPS                         float64                      `toml:"write_qps"`
		WriteBurst                       int64                        `toml:"write_burst"`
		WorkloadProvider                 string                       `toml:"workload_provider"`
		BatchsandboxTemplateFile         string                       `toml:"batchsandbox_template_file"`
		SandboxCreateTimeoutSeconds      int64                        `toml:"sandbox_create_timeout_seconds"`
		SandboxCreatePollIntervalSeconds float64                      `toml:"sandbox_create_poll_interval_seconds"`
		ExecdInitResources               map[string]map[string]string `toml:"execd_init_resources"`
	} `toml:"kubernetes"`
	AgentSandbox struct {
		TemplateFile   string `toml:"template_file"`
		ShutdownPolicy string `toml:"shutdown_policy"`
		IngressEnabled bool   `toml:"ingress_enabled"`
	} `toml:"agent_sandbox"`
	Ingress struct {
		Mode    string `toml:"mode"`
		Gateway struct {
			Address string `toml:"address"`
			Route   struct {
				Mode string `toml:"mode"`
			} `toml:"route"`
		} `toml:"gateway"`
		SecureAccess struct {
			ActiveKey string `toml:"active_key"`
			Keys      []struct {
				KeyID string `toml:"key_id"`
				Key   string `toml:"key"`
			} `toml:"keys"`
		} `toml:"secure_access"`
	} `toml:"ingress"`
	Egress struct {
		Image       string `toml:"image"`
		Mode        string `toml:"mode"`
		DisableIPv6 bool   `toml:"disable_ipv6"`
	} `toml:"egress"`
	SecureRuntime struct {
		Type            string `toml:"type"`
		DockerRuntime   string `toml:"docker_runtime"`
		K8sRuntimeClass string `toml:"k8s_runtime_class"`
	} `toml:"secure_runtime"`
	Podman struct {
		SocketPath string `toml:"socket_path"`
	} `toml:"podman"`
	// Store is read whole: none of its keys has an effect here.
	Store map[string]any `toml:"store"`
}

// legacyOnly are keys only the existing server's format has; a file with
// one of them and no version key is read as that format.
var legacyOnly = [][]string{
	{"log"}, {"renew_intent"}, {"storage"}, {"docker"}, {"kubernetes"}, {"ingress"}, {"store"},
	{"secure_runtime"}, {"podman"}, {"agent_sandbox"},
	{"server", "host"}, {"server", "port"}, {"server", "eip"}, {"server", "max_sandbox_timeout_seconds"},
	{"server", "timeout_keep_alive"}, {"runtime", "execd_image"},
}

// isLegacy reports whether the TOML document data is in the existing
// server's format. It answers false for a document that does not parse:
// the loader of this server's format then names the syntax error.
func isLegacy(data []byte) bool {
	var raw map[string]any
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&raw)
	if err != nil || md.IsDefined("version") {
		return false
	}
	for _, k := range legacyOnly {
		if md.IsDefined(k...) {
			return true
		}
	}
	return false
}

// readWhole reports whether k lies in a table that is read whole, with
// no effect here: [store].
func readWhole(k toml.Key) bool {
	return k[0] == "store"
}

// configNote says why a key of the existing server's format has no effect
// here, or how its value was adjusted.
type configNote struct {
	Key string
	Why string
}

func (n configNote) String() string { return n.Key + ": " + n.Why }

// noEffect gives the reason a key has no effect, by key or by the table
// that holds it (the longest match wins). Keys whose reason depends on the
// runtime are handled in legacyNotes.
var noEffect = map[string]string{
	"server.timeout_keep_alive":                       "idle client connections are closed after 2 minutes",
	"log.file_enabled":                                "this server logs to standard error; send it to a file with the service manager (systemd, docker logs)",
	"log.file_path":                                   "this server logs to standard error; send it to a file with the service manager (systemd, docker logs)",
	"log.access_file_path":                            "this server logs to standard error; send it to a file with the service manager (systemd, docker logs)",
	"log.file_max_bytes":                              "this server logs to standard error; the service manager rotates its log",
	"log.file_backup_count":                           "this server logs to standard error; the service manager rotates its log",
	"renew_intent":                                    "renew-on-access needs neither a switch nor Redis here: traffic through this server's proxy route or the ingress gateway renews sandboxes created with extensions access.renew.extend.seconds",
	"storage.volume_default_size":                     "this server makes no PVCs of its own; a pvc volume names an existing claim",
	"storage.ossfs_mount_root":                        "ossfs volumes are not supported by this server",
	"docker.api_timeout":                              "each engine operation has its own bound (runtime.docker.start_timeout, pull_timeout)",
	"kubernetes.informer_enabled":                     "this server always watches its pods through informers",
	"kubernetes.informer_resync_seconds":              "this server's informers have no such setting",
	"kubernetes.informer_watch_timeout_seconds":       "this server's informers have no such setting",
	"kubernetes.read_qps":                             "this server does not rate-limit its calls to the Kubernetes API",
	"kubernetes.read_burst":                           "this server does not rate-limit its calls to the Kubernetes API",
	"kubernetes.write_qps":                            "this server does not rate-limit its calls to the Kubernetes API",
	"kubernetes.write_burst":                          "this server does not rate-limit its calls to the Kubernetes API",
	"kubernetes.workload_provider":                    "this server runs each sandbox as a plain Pod (no BatchSandbox or agent-sandbox resources)",
	"kubernetes.batchsandbox_template_file":           "a BatchSandbox template is not a Pod; put pod settings in runtime.kubernetes.pod_template_file",
	"kubernetes.sandbox_create_poll_interval_seconds": "this server watches pods instead of polling them",
	"kubernetes.execd_init_resources":                 "the init container that copies execd has fixed, small requests",
	"agent_sandbox":                                   "this server runs each sandbox as a plain Pod (no agent-sandbox resources)",
	"egress.image":                                    "that image is the existing server's egress sidecar; this server starts its own osb-egress (egress.image, default opensandbox/egress:latest)",
	"egress.disable_ipv6":                             "IPv6 follows egress.mode here (docs/egress.md): stopped in strict, filtered like IPv4 in dns+nft, not stopped in dns",
	"podman":                                          "this server has no Podman runtime",
	"store":                                           "this server keeps its state itself: runtime.docker.data_dir on Docker, the cluster's objects on Kubernetes",
}

// legacyNotes lists, in file order, the keys of md that have no effect on
// a server with runtime typ.
func legacyNotes(md toml.MetaData, typ string) []configNote {
	var notes []configNote
	for _, k := range md.Keys() {
		if md.Type(k...) == "Hash" {
			continue
		}
		key := k.String()
		why := legacyNoteFor(k, typ)
		if why != "" {
			notes = append(notes, configNote{Key: key, Why: why})
		}
	}
	return notes
}

func legacyNoteFor(k toml.Key, typ string) string {
	key := k.String()
	switch {
	case key == "runtime.execd_image" && typ == "docker":
		return "on Docker this server mounts its own static execd binary into every sandbox (runtime.docker.execd_path)"
	case key == "runtime.execd_image":
		return "that image holds the existing server's execd; sandbox pods get this server's own, of its version (runtime.kubernetes.execd_image, default opensandbox/execd:latest)"
	case key == "server.eip" && typ == "kubernetes":
		return "on Kubernetes endpoints are pod addresses, or this server's proxy (server.public_address)"
	case k[0] == "docker" && typ == "kubernetes":
		return "runtime.type is kubernetes"
	case k[0] == "kubernetes" && typ == "docker" && noEffect[key] == "":
		return "runtime.type is docker"
	case key == "secure_runtime.k8s_runtime_class" && typ == "docker":
		return "runtime.type is docker (secure_runtime.docker_runtime applies)"
	case key == "secure_runtime.docker_runtime" && typ == "kubernetes":
		return "runtime.type is kubernetes (secure_runtime.k8s_runtime_class applies)"
	}
	for i := len(k); i > 0; i-- {
		if why, ok := noEffect[toml.Key(k[:i]).String()]; ok {
			return why
		}
	}
	return ""
}

// legacyLevels maps the existing server's (Python) log levels to ours.
var legacyLevels = map[string]string{
	"DEBUG": "debug", "INFO": "info", "WARN": "warn", "WARNING": "warn",
	"ERROR": "error", "CRITICAL": "error", "FATAL": "error",
}

// dockerDefaultCaps is the capability set Docker gives a container; the
// existing server's drop_capabilities removes from it.
var dockerDefaultCaps = []string{"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
	"NET_BIND_SERVICE", "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}

// knownCap reports whether c is a Linux capability name (without CAP_).
func knownCap(c string) bool {
	return slices.Contains(linuxCaps, c)
}

var linuxCaps = []string{"AUDIT_CONTROL", "AUDIT_READ", "AUDIT_WRITE", "BLOCK_SUSPEND", "BPF", "CHECKPOINT_RESTORE",
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "IPC_LOCK", "IPC_OWNER", "KILL", "LEASE",
	"LINUX_IMMUTABLE", "MAC_ADMIN", "MAC_OVERRIDE", "MKNOD", "NET_ADMIN", "NET_BIND_SERVICE", "NET_BROADCAST",
	"NET_RAW", "PERFMON", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYSLOG", "SYS_ADMIN", "SYS_BOOT",
	"SYS_CHROOT", "SYS_MODULE", "SYS_NICE", "SYS_PACCT", "SYS_PTRACE", "SYS_RAWIO", "SYS_RESOURCE", "SYS_TIME",
	"SYS_TTY_CONFIG", "WAKE_ALARM"}

// sandboxCaps is the capability set a sandbox gets from a file in the
// existing format: Docker's default set less drop, never more than this
// server's own set. kept are the capabilities that file left to sandboxes
// which they do not get here.
func sandboxCaps(drop []string) (caps, kept []string, err error) {
	dropped := map[string]bool{}
	for _, c := range drop {
		n := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(c)), "CAP_")
		if n != "ALL" && !knownCap(n) {
			return nil, nil, fmt.Errorf("docker.drop_capabilities: %q is not a Linux capability", c)
		}
		dropped[n] = true
	}
	ours := docker.DefaultConfig().CapAdd
	caps = []string{}
	for _, c := range dockerDefaultCaps {
		if dropped["ALL"] || dropped[c] {
			continue
		}
		if slices.Contains(ours, c) {
			caps = append(caps, c)
		} else {
			kept = append(kept, c)
		}
	}
	return caps, kept, nil
}

// convertLegacy converts a file in the existing server's format into this
// server's commented format: the example for its runtime with the values
// the file sets. apiKey is written when the file has no api_key (empty:
// none, and the loader asks for one). It returns the notes on keys with no
// effect or an adjusted value, which the text carries as comments too. A
// value this server cannot honour safely is an error naming the key.
func convertLegacy(data []byte, apiKey string) (string, []configNote, error) {
	var lc legacyConfig
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&lc)
	if err != nil {
		return "", nil, err
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		var keys []string
		for _, k := range undecoded {
			if !readWhole(k) {
				keys = append(keys, k.String())
			}
		}
		if len(keys) > 0 {
			return "", nil, fmt.Errorf("unknown keys: %s (the file was read as the existing OpenSandbox server's format, for its key %s)",
				strings.Join(keys, ", "), firstLegacyKey(md))
		}
	}

	typ := lc.Runtime.Type
	switch typ {
	case "":
		typ = "docker"
	case "docker", "kubernetes":
	case "podman":
		return "", nil, errors.New("runtime.type: \"podman\": this server drives Docker or Kubernetes; point it at Podman's Docker-compatible socket with runtime.type = \"docker\" and DOCKER_HOST")
	default:
		return "", nil, fmt.Errorf("runtime.type: %q is not docker or kubernetes", typ)
	}
	e := &exampleEdit{}
	if typ == "docker" {
		e.text = exampleDocker
	} else {
		e.text = exampleKubernetes
		e.set("runtime", "type", "kubernetes")
	}
	notes := legacyNotes(md, typ)

	s := &lc.Server
	if md.IsDefined("server", "host") || md.IsDefined("server", "port") {
		host, port := "0.0.0.0", 8080 // the existing server's defaults
		if s.Host != "" {
			host = s.Host
		}
		if s.Port != nil {
			port = *s.Port
		}
		if port < 1 || port > 65535 {
			return "", nil, fmt.Errorf("server.port: %d is not a port", port)
		}
		e.set("server", "listen", net.JoinHostPort(host, strconv.Itoa(port)))
	}
	key := s.APIKey
	if key == "" && apiKey != "" {
		key = apiKey
		notes = append(notes, configNote{Key: "server.api_key", Why: "the file had none; a new key was written (this server needs one)"})
	}
	e.set("server", "api_key", key)
	// Absent, the existing server sets no upper bound.
	maxTimeout := time.Duration(0)
	if t := s.MaxSandboxTimeoutSeconds; t != nil {
		if *t < 60 || *t > 100*365*24*3600 {
			return "", nil, fmt.Errorf("server.max_sandbox_timeout_seconds: %d: want at least 60 (seconds), at most 100 years", *t)
		}
		maxTimeout = time.Duration(*t) * time.Second
	}
	e.set("server", "max_sandbox_timeout", maxTimeout.String())
	for _, lv := range []struct{ key, v string }{{"server.log_level", s.LogLevel}, {"log.level", lc.Log.Level}} {
		if lv.v == "" {
			continue
		}
		level, ok := legacyLevels[strings.ToUpper(lv.v)]
		if !ok {
			return "", nil, fmt.Errorf("%s: %q is not DEBUG, INFO, WARNING, ERROR or CRITICAL", lv.key, lv.v)
		}
		e.set("server", "log_level", level)
	}
	for _, p := range lc.Storage.AllowedHostPaths {
		if !filepath.IsAbs(p) {
			return "", nil, fmt.Errorf("storage.allowed_host_paths: %q is not an absolute path", p)
		}
	}
	if lc.Storage.AllowedHostPaths != nil {
		e.set("server", "host_volume_allowlist", lc.Storage.AllowedHostPaths)
	}

	notes, err = convertLegacyIngress(&lc, md, e, notes)
	if err != nil {
		return "", nil, err
	}
	switch lc.Egress.Mode {
	case "":
	case "dns", "dns+nft":
		if lc.Egress.Mode == "dns" {
			notes = append(notes, configNote{Key: "egress.mode", Why: "\"dns\" here does not stop IPv6, which the existing server disabled by default; \"dns+nft\" filters it, \"strict\" stops it"})
		}
		e.addSection("egress", "# How sandboxes with a network policy are enforced (docs/egress.md).", "mode", lc.Egress.Mode)
	default:
		return "", nil, fmt.Errorf("egress.mode: %q is not dns or dns+nft", lc.Egress.Mode)
	}

	var err2 error
	if typ == "docker" {
		notes, err2 = convertLegacyDocker(&lc, md, e, notes)
	} else {
		err2 = convertLegacyKubernetes(&lc, e)
	}
	if err2 != nil {
		return "", nil, err2
	}
	if e.err != nil {
		return "", nil, e.err
	}
	return legacyHeader(notes) + e.text, notes, nil
}

// convertLegacyIngress maps [ingress]: the gateway's address and route
// mode, and the secure-access keys, the active one first. The keys carry
// over, but not the links the existing server signed: its signatures
// are of another form.
func convertLegacyIngress(lc *legacyConfig, md toml.MetaData, e *exampleEdit, notes []configNote) ([]configNote, error) {
	in := &lc.Ingress
	switch in.Mode {
	case "", ingressDirect:
		if md.IsDefined("ingress", "gateway") {
			return nil, errors.New("ingress.gateway: set, but ingress.mode is not \"gateway\"")
		}
	case ingressGateway:
		e.set("ingress", "mode", ingressGateway)
		addr, route := in.Gateway.Address, in.Gateway.Route.Mode
		switch route {
		case "wildcard":
			domain, ok := strings.CutPrefix(addr, "*.")
			if !ok {
				return nil, fmt.Errorf("ingress.gateway.address %q: a wildcard domain (*.example.com) with route.mode = \"wildcard\"", addr)
			}
			e.set("ingress", "domain", domain)
		case "header", "uri":
			if addr == "" {
				return nil, fmt.Errorf("ingress.gateway.address: required with route.mode = %q", route)
			}
			e.set("ingress", "address", addr)
		default:
			return nil, fmt.Errorf("ingress.gateway.route.mode: %q is not wildcard, header or uri", route)
		}
		e.set("ingress", "route_mode", route)
	default:
		return nil, fmt.Errorf("ingress.mode: %q is not direct or gateway", in.Mode)
	}
	sa := &in.SecureAccess
	if len(sa.Keys) == 0 {
		if sa.ActiveKey != "" {
			return nil, errors.New("ingress.secure_access.active_key: set, but ingress.secure_access.keys is empty")
		}
		return notes, nil
	}
	var active string
	var rest []string
	for i, k := range sa.Keys {
		spec := k.KeyID + ":" + k.Key
		if _, err := ingress.ParseKey(spec); err != nil {
			return nil, fmt.Errorf("ingress.secure_access.keys[%d]: %v (this server needs secrets of at least 32 bytes: make keys with opensandbox-server gen-signing-key)", i, err)
		}
		if k.KeyID == sa.ActiveKey && active == "" {
			active = spec
		} else {
			rest = append(rest, spec)
		}
	}
	if active == "" {
		return nil, fmt.Errorf("ingress.secure_access.active_key %q: no key of ingress.secure_access.keys has that key_id", sa.ActiveKey)
	}
	e.set("ingress", "signing_keys", append([]string{active}, rest...))
	notes = append(notes, configNote{Key: "ingress.secure_access.keys",
		Why: "the keys carry over as ingress.signing_keys (the active one first), but links the existing server signed do not verify here: its signatures are of another form; clients get new ones from the endpoint API"})
	return notes, nil
}

func convertLegacyDocker(lc *legacyConfig, md toml.MetaData, e *exampleEdit, notes []configNote) ([]configNote, error) {
	d := &lc.Docker
	switch d.NetworkMode {
	case "", "bridge", "default":
		// This server's own bridge, on which sandboxes cannot reach each other.
	case "host":
		return nil, errors.New("docker.network_mode: \"host\": sandboxes would share the host's network and reach its services; this server puts them on a bridge of their own (remove the key)")
	case "none":
		return nil, errors.New("docker.network_mode: \"none\": sandboxes without a network cannot be reached by clients (remove the key)")
	default:
		if strings.HasPrefix(d.NetworkMode, "container:") {
			return nil, fmt.Errorf("docker.network_mode: %q: sandboxes would share another container's network; use a network name", d.NetworkMode)
		}
		e.set("runtime.docker", "network", d.NetworkMode)
	}
	if d.NoNewPrivileges != nil && !*d.NoNewPrivileges {
		return nil, errors.New("docker.no_new_privileges = false: sandboxes here always run with no-new-privileges, so that setuid programs cannot gain privileges (remove the key or set it true)")
	}
	switch d.ApparmorProfile {
	case "", "docker-default":
	case "unconfined":
		return nil, errors.New("docker.apparmor_profile = \"unconfined\": sandboxes here always run under Docker's default AppArmor profile (remove the key)")
	default:
		return nil, fmt.Errorf("docker.apparmor_profile = %q: this server cannot apply another AppArmor profile than Docker's default, and would run sandboxes less confined than asked (remove the key to accept the default)", d.ApparmorProfile)
	}
	switch d.SeccompProfile {
	case "", "default", "docker-default":
	case "unconfined":
		return nil, errors.New("docker.seccomp_profile = \"unconfined\": sandboxes here always run under a seccomp profile (remove the key)")
	default:
		return nil, fmt.Errorf("docker.seccomp_profile = %q: this server cannot apply a seccomp profile of its own choosing, and would run sandboxes less confined than asked (remove the key to accept Docker's default)", d.SeccompProfile)
	}
	if d.PidsLimit != nil {
		if *d.PidsLimit < 1 {
			return nil, fmt.Errorf("docker.pids_limit: %d: want at least 1", *d.PidsLimit)
		}
		e.setInt("runtime.docker", "pids_limit", *d.PidsLimit)
	}
	if md.IsDefined("docker", "drop_capabilities") {
		caps, kept, err := sandboxCaps(d.DropCapabilities)
		if err != nil {
			return nil, err
		}
		if len(kept) > 0 {
			notes = append(notes, configNote{Key: "docker.drop_capabilities",
				Why: "does not drop " + strings.Join(kept, ", ") + "; sandboxes here never get these capabilities"})
		}
		e.insert("runtime.docker", "# Capabilities of sandboxes, all others dropped (from docker.drop_capabilities).", "capabilities", caps)
	}
	if host := cmpOr(lc.Server.EIP, d.HostIP); host != "" {
		e.set("runtime.docker", "public_host", host)
	}
	sr := &lc.SecureRuntime
	switch sr.Type {
	case "":
		if sr.DockerRuntime != "" {
			return nil, errors.New("secure_runtime.docker_runtime: set, but secure_runtime.type is empty")
		}
	case "gvisor", "kata":
		if sr.DockerRuntime == "" {
			return nil, fmt.Errorf("secure_runtime.type = %q with no secure_runtime.docker_runtime: sandboxes would run without the isolation asked for", sr.Type)
		}
		e.set("runtime.docker", "runtime", sr.DockerRuntime)
		allowed := []string{"runc", "runsc"}
		if !slices.Contains(allowed, sr.DockerRuntime) {
			allowed = append(allowed, sr.DockerRuntime)
		}
		e.set("runtime.docker", "allowed_runtimes", allowed)
	case "firecracker":
		return nil, errors.New("secure_runtime.type = \"firecracker\": Kubernetes only (runtime.type is docker)")
	default:
		return nil, fmt.Errorf("secure_runtime.type: %q is not gvisor, kata or firecracker", sr.Type)
	}
	return notes, nil
}

func convertLegacyKubernetes(lc *legacyConfig, e *exampleEdit) error {
	k := &lc.Kubernetes
	if p := k.KubeconfigPath; p != "" {
		if rest, ok := strings.CutPrefix(p, "~/"); ok {
			home, err := os.UserHomeDir()
			if err != nil {
				return fmt.Errorf("kubernetes.kubeconfig_path: %w", err)
			}
			p = filepath.Join(home, rest)
		}
		e.set("runtime.kubernetes", "kubeconfig", p)
	}
	if k.Namespace != "" {
		e.set("runtime.kubernetes", "namespace", k.Namespace)
	}
	if k.ServiceAccount != "" {
		e.set("runtime.kubernetes", "service_account", k.ServiceAccount)
	}
	if k.ImagePullPolicy != "" {
		e.set("runtime.kubernetes", "image_pull_policy", k.ImagePullPolicy)
	}
	if t := k.SandboxCreateTimeoutSeconds; t != 0 {
		if t < 1 || t > 7*24*3600 {
			return fmt.Errorf("kubernetes.sandbox_create_timeout_seconds: %d: want 1 to 604800", t)
		}
		e.set("runtime.kubernetes", "start_timeout", (time.Duration(t) * time.Second).String())
	}
	sr := &lc.SecureRuntime
	switch sr.Type {
	case "":
		if sr.K8sRuntimeClass != "" {
			return errors.New("secure_runtime.k8s_runtime_class: set, but secure_runtime.type is empty")
		}
	case "gvisor", "kata", "firecracker":
		if sr.K8sRuntimeClass == "" {
			return fmt.Errorf("secure_runtime.type = %q with no secure_runtime.k8s_runtime_class: sandboxes would run without the isolation asked for", sr.Type)
		}
		e.set("runtime.kubernetes", "runtime_class_name", sr.K8sRuntimeClass)
	default:
		return fmt.Errorf("secure_runtime.type: %q is not gvisor, kata or firecracker", sr.Type)
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// firstLegacyKey names the key that made a file read as the existing
// server's format.
func firstLegacyKey(md toml.MetaData) string {
	for _, k := range legacyOnly {
		if md.IsDefined(k...) {
			return toml.Key(k).String()
		}
	}
	return "?"
}

// legacyHeader is the comment that opens a converted file.
func legacyHeader(notes []configNote) string {
	var b strings.Builder
	b.WriteString("# Converted from a configuration of the existing OpenSandbox server\n")
	b.WriteString("# (opensandbox-server init-config --from). docs/configuration.md has the\n# table of how each of its keys maps to this format.\n")
	if len(notes) > 0 {
		b.WriteString("#\n# Keys of that file with no effect here, or adjusted:\n")
		for _, n := range notes {
			b.WriteString("#   " + strings.ReplaceAll(n.String(), "\n", " ") + "\n")
		}
	}
	b.WriteString("#\n")
	return b.String()
}

// exampleEdit sets values in an example configuration's text, keeping its
// comments. The first error sticks.
type exampleEdit struct {
	text string
	err  error
}

// tomlValue is v written as a TOML value.
func tomlValue(v any) string {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(map[string]any{"v": v}); err != nil {
		panic(err) // strings, string slices and integers always encode
	}
	return strings.TrimSpace(strings.TrimPrefix(buf.String(), "v = "))
}

// sectionBounds returns the line range [start, end) of the body of table
// section in lines.
func sectionBounds(lines []string, section string) (int, int, bool) {
	start := -1
	for i, l := range lines {
		t := strings.TrimSpace(l)
		if start < 0 {
			if t == "["+section+"]" {
				start = i + 1
			}
			continue
		}
		if strings.HasPrefix(t, "[") {
			return start, i, true
		}
	}
	return start, len(lines), start >= 0
}

// set replaces the line "key = ..." of the table section.
func (e *exampleEdit) set(section, key string, v any) {
	e.setLiteral(section, key, tomlValue(v))
}

func (e *exampleEdit) setInt(section, key string, v int64) {
	e.setLiteral(section, key, strconv.FormatInt(v, 10))
}

func (e *exampleEdit) setLiteral(section, key, literal string) {
	if e.err != nil {
		return
	}
	lines := strings.Split(e.text, "\n")
	start, end, ok := sectionBounds(lines, section)
	if ok {
		for i := start; i < end; i++ {
			if strings.HasPrefix(lines[i], key+" = ") {
				lines[i] = key + " = " + literal
				e.text = strings.Join(lines, "\n")
				return
			}
		}
	}
	e.err = fmt.Errorf("example configuration: no %s in [%s]", key, section)
}

// insert adds "key = v", after comment, at the top of the table section.
func (e *exampleEdit) insert(section, comment, key string, v any) {
	if e.err != nil {
		return
	}
	lines := strings.Split(e.text, "\n")
	start, _, ok := sectionBounds(lines, section)
	if !ok {
		e.err = fmt.Errorf("example configuration: no [%s]", section)
		return
	}
	add := []string{comment, key + " = " + tomlValue(v)}
	e.text = strings.Join(slices.Insert(lines, start, add...), "\n")
}

// addSection appends the table section with one key.
func (e *exampleEdit) addSection(section, comment, key string, v any) {
	e.text += "\n[" + section + "]\n" + comment + "\n" + key + " = " + tomlValue(v) + "\n"
}
