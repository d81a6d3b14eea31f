package main

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/hostpath"
	"github.com/opensandbox/opensandbox/internal/httpx"
	"github.com/opensandbox/opensandbox/lifecycle"
	"github.com/opensandbox/opensandbox/runtime/docker"
	"github.com/opensandbox/opensandbox/runtime/kubernetes"
	"github.com/opensandbox/opensandbox/sandbox"
)

// configVersion is the version of the configuration file format this
// server reads.
const configVersion = 1

// fileConfig is the server's configuration file (TOML). docs/configuration.md
// documents every key; init-config writes a commented example.
type fileConfig struct {
	Version int           `toml:"version"`
	Server  serverConfig  `toml:"server"`
	Runtime runtimeConfig `toml:"runtime"`
	Pools   []poolConfig  `toml:"pools"`
	// Egress is how sandboxes with a network policy are enforced.
	Egress sandbox.EgressConfig `toml:"egress"`
	// Ingress is how clients reach sandbox ports: directly or through a
	// gateway, which this server may serve itself.
	Ingress ingressConfig `toml:"ingress"`

	// Notes are the keys of a file in the existing server's format that
	// have no effect here, logged at start.
	Notes []configNote `toml:"-"`
}

// poolConfig is one [[pools]] table: a warm pool the server keeps.
type poolConfig struct {
	Name           string            `toml:"name"`
	Image          string            `toml:"image"`
	Entrypoint     []string          `toml:"entrypoint"`
	Env            map[string]string `toml:"env"`
	ResourceLimits map[string]string `toml:"resource_limits"`
	BufferMin      int               `toml:"buffer_min"`
	BufferMax      int               `toml:"buffer_max"`
	PoolMin        int               `toml:"pool_min"`
	PoolMax        int               `toml:"pool_max"`
	// NetworkPolicy is the egress policy of the pool's sandboxes, as
	// JSON (networkPolicy of a create); empty: none.
	NetworkPolicy string `toml:"network_policy"`
	// Extensions are given to the sandboxes a create naming the pool
	// gets: ingress.public, access.renew.extend.seconds.
	Extensions map[string]string `toml:"extensions"`
}

// definition is the pool p describes, validated as the /pools routes do.
func (p *poolConfig) definition() (sandbox.Pool, error) {
	def, err := lifecycle.PoolFromRequest(&api.PoolRequest{
		Name: p.Name,
		Template: &api.PoolTemplate{Image: &api.ImageSpec{URI: p.Image}, Entrypoint: p.Entrypoint,
			Env: p.Env, ResourceLimits: p.ResourceLimits, NetworkPolicy: json.RawMessage(p.NetworkPolicy), Extensions: p.Extensions},
		CapacitySpec: &api.CapacitySpec{BufferMin: p.BufferMin, BufferMax: p.BufferMax, PoolMin: p.PoolMin, PoolMax: p.PoolMax},
	})
	if err != nil {
		var he *httpx.Error
		if errors.As(err, &he) {
			err = errors.New(he.Message)
		}
		return def, err
	}
	def.FromConfig = true
	return def, nil
}

type serverConfig struct {
	Listen              string        `toml:"listen"`
	APIKey              string        `toml:"api_key"`
	Insecure            bool          `toml:"insecure"`
	PublicAddress       string        `toml:"public_address"`
	MaxSandboxTimeout   time.Duration `toml:"max_sandbox_timeout"`
	MinSandboxTimeout   time.Duration `toml:"min_sandbox_timeout"`
	HostVolumeAllowlist []string      `toml:"host_volume_allowlist"`
	// AllowedExtensions are extension keys creates may carry besides
	// those the server and its runtime read ("team.*" for a prefix).
	AllowedExtensions []string `toml:"allowed_extensions"`
	// AllowLocalRegistries accepts images from registries on loopback,
	// unspecified or link-local addresses and localhost names.
	AllowLocalRegistries bool   `toml:"allow_local_registries"`
	MaxBodyBytes         int64  `toml:"max_body_bytes"`
	LogLevel             string `toml:"log_level"`
	LogFormat            string `toml:"log_format"`
	// MetricsAuth makes GET /metrics need the API key (also accepted as
	// a bearer token). nil until setDefaults makes it true.
	MetricsAuth *bool `toml:"metrics_auth"`
}

type runtimeConfig struct {
	Type       string            `toml:"type"`
	Docker     docker.Config     `toml:"docker"`
	Kubernetes kubernetes.Config `toml:"kubernetes"`
}

// envAPIKey overrides the configured API key.
const envAPIKey = "OPENSANDBOX_SERVER_API_KEY"

// envConfigPath names the configuration file when --config does not.
const envConfigPath = "SANDBOX_CONFIG_PATH"

// findConfig returns the configuration file to read: --config, then
// $SANDBOX_CONFIG_PATH, then ~/.sandbox.toml.
func findConfig(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if p := os.Getenv(envConfigPath); p != "" {
		return p, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no --config, no %s, and no home directory: %w", envConfigPath, err)
	}
	return filepath.Join(home, ".sandbox.toml"), nil
}

// loadConfig reads and checks a configuration file. Unknown keys are an
// error, so a typo never goes unnoticed. insecure stands for the
// --insecure flag, which overrides server.insecure.
func loadConfig(path string, insecure bool) (*fileConfig, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no configuration at %s; write one with:\n  opensandbox-server init-config %s --example docker   (or --example kubernetes)", path, path)
	}
	if err != nil {
		return nil, err
	}
	// A file in the existing server's format is converted into this
	// server's, and the keys with no effect here are kept for the log.
	var notes []configNote
	if isLegacy(data) {
		text, n, err := convertLegacy(data, "")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		data, notes = []byte(text), n
	}
	var cfg fileConfig
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		keys := make([]string, len(undecoded))
		for i, k := range undecoded {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("%s: unknown keys: %s", path, strings.Join(keys, ", "))
	}
	if cfg.Version != configVersion {
		return nil, fmt.Errorf("%s: version = %d; this server reads version %d", path, cfg.Version, configVersion)
	}
	cfg.Notes = notes
	cfg.setDefaults()
	if key := os.Getenv(envAPIKey); key != "" {
		cfg.Server.APIKey = key
	}
	if insecure {
		cfg.Server.Insecure = true
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &cfg, nil
}

func (c *fileConfig) setDefaults() {
	if c.Runtime.Docker.DataDir == "" && c.Runtime.Type != "kubernetes" {
		c.Runtime.Docker.DataDir = docker.DefaultConfig().DataDir
	}
	s := &c.Server
	if s.Listen == "" {
		s.Listen = "127.0.0.1:8080"
	}
	if s.MinSandboxTimeout == 0 {
		s.MinSandboxTimeout = 60 * time.Second
	}
	if s.LogLevel == "" {
		s.LogLevel = "info"
	}
	if s.LogFormat == "" {
		s.LogFormat = "text"
	}
	if s.MetricsAuth == nil {
		t := true
		s.MetricsAuth = &t
	}
	if c.Runtime.Type == "" {
		c.Runtime.Type = "docker"
	}
	c.Egress.SetDefaults()
	c.Ingress.setDefaults()
}

func (c *fileConfig) validate() error {
	if err := c.Egress.Validate(); err != nil {
		return err
	}
	if err := c.Ingress.validate(); err != nil {
		return err
	}
	s := &c.Server
	if s.APIKey == "" && !s.Insecure {
		return errNoAPIKey
	}
	if s.APIKey != "" && len(s.APIKey) < 16 {
		return errors.New("server.api_key: shorter than 16 characters; generate one with opensandbox-server gen-key")
	}
	if s.MaxSandboxTimeout < 0 || s.MinSandboxTimeout < 0 || (s.MaxSandboxTimeout > 0 && s.MaxSandboxTimeout < s.MinSandboxTimeout) {
		return errors.New("server.max_sandbox_timeout must be 0 (no limit) or at least server.min_sandbox_timeout")
	}
	for _, p := range s.HostVolumeAllowlist {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("server.host_volume_allowlist: %q is not an absolute path", p)
		}
		// The runtime's data holds every sandbox's token and the staging
		// paths of its volume pins: no sandbox may mount it, a directory
		// above it, or one inside it (where it could put a link).
		if dataDir := c.Runtime.Docker.DataDir; dataDir != "" {
			for _, pair := range pathForms(p, dataDir) {
				entry, data := pair[0], pair[1]
				if hostpath.Within(data, entry) {
					return fmt.Errorf("server.host_volume_allowlist: %q contains runtime.docker.data_dir %s, which holds the sandboxes' tokens", p, dataDir)
				}
				if hostpath.Within(entry, data) {
					return fmt.Errorf("server.host_volume_allowlist: %q lies inside runtime.docker.data_dir %s, which holds the sandboxes' tokens and volume pins", p, dataDir)
				}
			}
		}
	}
	for _, k := range s.AllowedExtensions {
		if k == "" || strings.Contains(strings.TrimSuffix(k, "*"), "*") {
			return fmt.Errorf("server.allowed_extensions: %q: want a key, or a prefix followed by *", k)
		}
	}
	switch s.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("server.log_format: %q is not text or json", s.LogFormat)
	}
	seen := map[string]bool{}
	for i := range c.Pools {
		def, err := c.Pools[i].definition()
		if err != nil {
			return fmt.Errorf("pools[%d]: %w", i, err)
		}
		if seen[def.Name] {
			return fmt.Errorf("pools[%d]: pool %s is defined twice", i, def.Name)
		}
		seen[def.Name] = true
	}
	switch c.Runtime.Type {
	case "docker":
	case "kubernetes":
		k := c.Runtime.Kubernetes
		if err := k.Check(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("runtime.type: %q is not docker or kubernetes", c.Runtime.Type)
	}
	return nil
}

// pathForms pairs a and b as written (cleaned) and with the links of
// their existing parts resolved (a data directory made at first start
// included).
func pathForms(a, b string) [][2]string {
	a, b = filepath.Clean(a), filepath.Clean(b)
	forms := [][2]string{{a, b}}
	ra, errA := hostpath.Resolve(a)
	rb, errB := hostpath.Resolve(b)
	if errA != nil {
		ra = a
	}
	if errB != nil {
		rb = b
	}
	if ra != a || rb != b {
		forms = append(forms, [2]string{ra, rb})
	}
	return forms
}

var errNoAPIKey = errors.New("no API key: set server.api_key (or " + envAPIKey + ") to a key made with\n  opensandbox-server gen-key\nor set server.insecure = true to accept every request (local experiments only)")

// genKey returns a new API key: 32 random bytes, base64url.
func genKey() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// exampleServer is the part of every example configuration before the
// runtime table. {{KEY}} is replaced by a fresh API key.
const exampleServer = `# OpenSandbox server configuration. Every key is described in
# docs/configuration.md. Start the server with:
#   opensandbox-server --config THIS_FILE
version = 1

[server]
# Address the lifecycle API listens on. Keep it on loopback unless a
# reverse proxy with TLS is in front.
listen = "127.0.0.1:8080"
# Key every client sends in the OPEN-SANDBOX-API-KEY header (SDKs read it
# from OPEN_SANDBOX_API_KEY). The environment variable
# OPENSANDBOX_SERVER_API_KEY overrides it. Make a new one with
#   opensandbox-server gen-key
api_key = "{{KEY}}"
# Accept requests without a key. Only for experiments on a machine of your own.
insecure = false
# Address clients use to reach this server, for endpoints that go through
# its proxy (use_server_proxy). Default: the Host the client asked with.
public_address = ""
# Longest timeout a sandbox may ask for, and how far ahead a renewal may
# reach; "0s" means no limit.
max_sandbox_timeout = "24h"
# Shortest timeout a sandbox may ask for.
min_sandbox_timeout = "60s"
# Host directories sandboxes may mount as host volumes (and their
# subdirectories). Empty: host volumes are refused. The runtime's data_dir
# may not be under one of them.
host_volume_allowlist = []
# Extension keys a create may carry besides those this server and its
# runtime read (a create with any other key is refused); "team.*" allows
# every key with that prefix.
allowed_extensions = []
# Accept images from registries on this machine or its link (127.0.0.1,
# [::1], localhost, 169.254.0.0/16, fe80::/10): the engine pulls as the
# host, so such a reference reaches the host's own services.
allow_local_registries = false
# Largest request body, in bytes.
max_body_bytes = 1048576
# debug, info, warn or error; text or json.
log_level = "info"
log_format = "text"
# Whether GET /metrics (Prometheus) needs the API key, sent in
# OPEN-SANDBOX-API-KEY or as "Authorization: Bearer KEY". false serves
# it to anyone who reaches the listen address.
metrics_auth = true

[ingress]
# How clients reach the ports of sandboxes (docs/ingress.md).
#   "direct":  the runtime's own endpoints (on Docker: ports published on
#              bind_ip, reached through execd's forwarder).
#   "gateway": one address in front of every sandbox's ports, the ingress
#              gateway: osb-ingress, or this server itself on "listen".
#              Every request needs the sandbox's access token, which the
#              endpoint API hands out, or a signed link (expires).
mode = "direct"
# How a gateway endpoint names the sandbox and port:
#   "header":   address + header OpenSandbox-Ingress-To: {id}-{port} (SDKs)
#   "uri":      address/{id}/{port}/... (a browser opens a signed link;
#               the app must accept being served under that path)
#   "wildcard": {id}-{port}.{domain} (needs wildcard DNS to the gateway)
route_mode = "header"
# The gateway's host[:port] as clients reach it (header and uri modes).
# Default: listen, when it names a host.
address = ""
# wildcard mode: the domain whose subdomains reach the gateway.
domain = ""
# Signing keys "ID:BASE64": the first signs access tokens and links, all
# verify, so a key rotates by putting a new one first and removing the old
# one once its links have expired. Make one with
#   opensandbox-server gen-signing-key --id a
# Or keep them in signing_keys_file, one a line, read again when it changes.
signing_keys = []
signing_keys_file = ""
# Serve the gateway in this server on a second listener, and with TLS.
listen = ""
tls_cert = ""
tls_key = ""
#
# One machine, links a browser opens: set
#   mode = "gateway"
#   route_mode = "uri"
#   listen = "127.0.0.1:8081"
#   signing_keys = ["a:..."]   # from opensandbox-server gen-signing-key
# then "osb sandbox endpoint ID PORT --expires 1h" prints such a link.

`

// examplePools closes every example configuration.
const examplePools = `# Warm pools: sandboxes started ahead of time, so that a create takes
# milliseconds. A create with extensions.poolRef = "NAME" claims from the
# pool; a create whose image and resource limits match a pool's claims from
# it too. Pools can also be managed at run time through /v1/pools.
# [[pools]]
# name = "python"
# image = "opensandbox/python:3.11"
# entrypoint = ["tail", "-f", "/dev/null"]   # started when a sandbox is claimed
# env = { }
# resource_limits = { cpu = "1", memory = "2Gi" }
# buffer_min = 2      # refill when fewer are ready...
# buffer_max = 4      # ...up to this many ready
# pool_min = 0        # the pool's sandboxes, handed out ones included
# pool_max = 50
# extensions = { "ingress.public" = "true" }   # given to creates that name the pool
`

// exampleDocker is the commented configuration init-config writes for the
// Docker runtime.
const exampleDocker = exampleServer + `[runtime]
type = "docker"

[runtime.docker]
# Engine address; empty: DOCKER_HOST, else the local socket.
host = ""
# Where the runtime keeps its state database (expiry, metadata, tokens).
data_dir = "/var/lib/opensandbox/docker"
# The static execd binary mounted into every sandbox; empty: "execd"
# beside this server's binary.
execd_path = ""
# Tells this server's containers from others' on the same engine.
label_scope = "default"
# Host address sandbox ports are published on, and the host put in
# endpoints (default: bind_ip).
bind_ip = "127.0.0.1"
public_host = ""
# Docker network of the sandboxes. The default, "opensandbox", is a bridge
# the server makes, on which sandboxes cannot reach each other.
network = "opensandbox"
# Existing named volumes (by name prefix) sandboxes may mount; volumes the
# server made itself are always allowed.
named_volume_allowlist = []
# OCI runtime of sandboxes: "" (the engine's default, runc) or "runsc"
# (gVisor). A sandbox may ask for one of allowed_runtimes with the
# extension "docker.runtime".
runtime = ""
allowed_runtimes = ["runc", "runsc"]
# When images are pulled: "if-not-present", "always" or "never".
pull_policy = "if-not-present"
# How long a sandbox may take to answer once its container started, and
# how long one image pull may take.
start_timeout = "60s"
pull_timeout = "10m"
# Limits of a sandbox that asks for none; empty: unlimited.
default_cpu = "1"
default_memory = "2Gi"
# Disk a sandbox may fill (resourceLimits "ephemeral-storage") when it asks
# for no limit, e.g. "10Gi"; empty: unlimited. The server log says at start
# how limits are enforced on this engine (docs/configuration.md).
default_storage = ""
# Most processes in a sandbox; -1: no limit.
pids_limit = 4096
# Host firewall rules keep sandboxes from the host itself, from the cloud
# metadata services (169.254.0.0/16, 100.100.100.200, fd00:ec2::254)
# and from the ranges of blocked_cidrs (default: the private, shared and
# link-local ranges below); allowed_cidrs punches holes, one port of an
# address or a whole range ("10.1.2.3:443", "10.9.0.0/16"). Both lists
# emptied and block_metadata = false turn the rules off.
block_metadata = true
blocked_cidrs = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                 "169.254.0.0/16", "fc00::/7", "fe80::/10"]
allowed_cidrs = []
# Name servers of sandboxes; empty: the engine's (the host's
# resolv.conf). Sandboxes reach them on port 53 whatever blocked_cidrs says.
dns = []

` + examplePools

// exampleKubernetes is the commented configuration init-config writes for
// the Kubernetes runtime.
const exampleKubernetes = exampleServer + `[runtime]
type = "kubernetes"

[runtime.kubernetes]
# Cluster access; empty: KUBECONFIG, else ~/.kube/config, else the pod's
# service account when the server runs in the cluster.
kubeconfig = ""
# Namespace of the sandboxes' pods; empty: the server's own namespace in a
# cluster, else the kubeconfig context's, else "default".
namespace = ""
# Image whose /execd an init container copies into every sandbox pod.
execd_image = "opensandbox/execd:latest"
# Or a directory on every node that holds execd (same version as this
# server): pods mount it and start faster, with no init container.
execd_host_dir = ""
# Pull policy of sandbox images: IfNotPresent, Always or Never.
image_pull_policy = "IfNotPresent"
# RuntimeClass of sandbox pods ("" for the cluster's default, e.g.
# "gvisor"); a sandbox may ask for one of allowed_runtime_classes with the
# extension "kubernetes.runtimeClassName".
runtime_class_name = ""
# allowed_runtime_classes = ["gvisor"]   # default: runtime_class_name only
# Service account of sandbox pods; empty: no account token is mounted.
service_account = ""
# A Pod manifest (YAML) sandbox pods start from: node selector,
# tolerations, affinity, priority class, image pull secrets, DNS...
pod_template_file = ""
# Limits of a sandbox that asks for none; empty: unlimited.
default_cpu = "1"
default_memory = "2Gi"
# What the scheduler reserves for each sandbox (at most its limits).
cpu_request = "100m"
memory_request = "128Mi"
# Disk a sandbox may fill (ephemeral-storage; the kubelet evicts a pod
# over it) when it asks for no limit, e.g. "10Gi"; empty: unlimited. A
# sandbox with a limit reserves storage_request of it (at most the limit).
default_storage = ""
storage_request = "256Mi"
# Tells this server's objects from other servers' in the namespace.
label_scope = "default"
# The Lease by which replicas elect the one that enforces expiry, removes
# orphans and fills the pools (default "opensandbox-" + label_scope), and
# its timing.
lease_name = ""
lease_duration = "8s"
renew_deadline = "5s"
retry_period = "1s"
# How long a sandbox may stay Pending (image pull included) before it is
# reported Failed, and how long the scheduler may find no node for it
# (raise it where a cluster autoscaler adds nodes).
start_timeout = "10m"
schedule_timeout = "15s"
# A NetworkPolicy keeps sandbox pods from the metadata services and the
# ranges of blocked_cidrs (default: the private, shared and link-local
# ranges below), letting through the cluster's DNS (kube-dns pods, port
# 53) and allowed_cidrs. Enforced only by network plugins that implement
# NetworkPolicy (Calico, Cilium...).
network_policy = true
blocked_cidrs = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                 "169.254.0.0/16", "fc00::/7", "fe80::/10"]
allowed_cidrs = ["169.254.20.10:53"]   # NodeLocal DNSCache

` + examplePools

// writeConverted converts from, a file in the existing server's format,
// into this server's commented format at path (as writeExample writes),
// with a fresh API key if from has none. It returns the notes the new file
// carries as comments.
func writeConverted(path, from string, force bool) ([]configNote, error) {
	data, err := os.ReadFile(from)
	if err != nil {
		return nil, err
	}
	if !isLegacy(data) {
		return nil, fmt.Errorf("%s is not in the existing OpenSandbox server's format (it has a version key, or none of that format's own keys)", from)
	}
	text, notes, err := convertLegacy(data, genKey())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", from, err)
	}
	return notes, writeConfigFile(path, text, force)
}

// writeExample writes the example configuration for runtime to path, with
// a fresh API key, readable by its owner only. It refuses to overwrite a
// file unless force is set.
func writeExample(path, runtime string, force bool) error {
	var text string
	switch runtime {
	case "docker":
		text = exampleDocker
	case "kubernetes":
		text = exampleKubernetes
	default:
		return fmt.Errorf("--example %q: available examples: docker, kubernetes", runtime)
	}
	return writeConfigFile(path, strings.Replace(text, "{{KEY}}", genKey(), 1), force)
}

// writeConfigFile writes text to path, readable by its owner only (it
// holds the API key), refusing to overwrite a file unless force is set.
func writeConfigFile(path, text string, force bool) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s exists; pass --force to overwrite it", path)
	}
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
