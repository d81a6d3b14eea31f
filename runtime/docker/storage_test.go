package docker

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/moby/profiles/seccomp"

	"github.com/opensandbox/opensandbox/sandbox"
)

func TestStoragePolicy(t *testing.T) {
	for _, c := range []struct {
		name    string
		st      engineStorage
		visible bool
		want    string
	}{
		{"overlay2 on ext4 (this machine)", engineStorage{Driver: "overlay2", BackingFS: "extfs"}, true, storageWatch},
		{"overlay2 on xfs", engineStorage{Driver: "overlay2", BackingFS: "xfs"}, true, storageEngine},
		{"overlay2 on xfs, remote", engineStorage{Driver: "overlay2", BackingFS: "xfs"}, false, storageEngine},
		{"overlay2 on ext4, remote", engineStorage{Driver: "overlay2", BackingFS: "extfs"}, false, storageNone},
		{"devicemapper", engineStorage{Driver: "devicemapper", BackingFS: "extfs"}, true, storageNone},
		{"vfs", engineStorage{Driver: "vfs"}, true, storageNone},
	} {
		p, err := storagePolicyFor(c.st, c.visible)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.mode(); got != c.want || p.why == "" {
			t.Errorf("%s: mode %s (%s), want %s", c.name, got, p.why, c.want)
		}
	}
	var none *storagePolicy
	if none.mode() != storageNone {
		t.Errorf("no policy: mode %s", none.mode())
	}
	// An engine that turns out to refuse quotas falls back to watching,
	// if it can.
	p, _ := storagePolicyFor(engineStorage{Driver: "overlay2", BackingFS: "xfs"}, true)
	p.engineQuota.Store(false)
	if p.mode() != storageWatch {
		t.Errorf("xfs without quotas: mode %s, want watch", p.mode())
	}

	for args, want := range map[string]bool{"--network=host": false, "--network=host --oci-seccomp": true, "--oci-seccomp=true": true, "-oci-seccomp": true, "--oci-seccomp=false": false} {
		if got := hasOCISeccomp(strings.Fields(args)); got != want {
			t.Errorf("hasOCISeccomp(%s) = %v", args, got)
		}
	}
}

// TestWatchedSeccompProfile: the profile of watched sandboxes is the
// default one with fallocate answering EOPNOTSUPP, and nothing else
// changed.
func TestWatchedSeccompProfile(t *testing.T) {
	raw, err := watchedSeccompProfile()
	if err != nil {
		t.Fatal(err)
	}
	var got seccomp.Seccomp
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatal(err)
	}
	def := seccomp.DefaultProfile()
	if got.DefaultAction != def.DefaultAction || len(got.Syscalls) != len(def.Syscalls)+1 {
		t.Fatalf("profile: default action %s, %d rules; want the default's (%s, %d) and one more", got.DefaultAction, len(got.Syscalls), def.DefaultAction, len(def.Syscalls))
	}
	var rules []*seccomp.Syscall
	allowed := 0
	for i, s := range got.Syscalls {
		if slices.Contains(s.Names, "fallocate") {
			rules = append(rules, s)
		}
		if i < len(def.Syscalls) {
			allowed += len(s.Names)
			if n := len(def.Syscalls[i].Names); slices.Contains(def.Syscalls[i].Names, "fallocate") {
				allowed++ // the one taken out
			} else if len(s.Names) != n {
				t.Errorf("rule %d lost a name: %v", i, s.Names)
			}
		}
	}
	if len(rules) != 1 || rules[0].Action != "SCMP_ACT_ERRNO" || rules[0].ErrnoRet == nil || *rules[0].ErrnoRet != eopnotsupp || len(rules[0].Names) != 1 {
		t.Fatalf("fallocate rules: %+v, want one that fails with EOPNOTSUPP", rules)
	}
}

func TestApplyStorage(t *testing.T) {
	watch, _ := storagePolicyFor(engineStorage{Driver: "overlay2", BackingFS: "extfs", LogDriver: "json-file"}, true)
	engine, _ := storagePolicyFor(engineStorage{Driver: "overlay2", BackingFS: "xfs", LogDriver: "journald"}, true)
	none, _ := storagePolicyFor(engineStorage{Driver: "vfs"}, true)
	gvisor, _ := storagePolicyFor(engineStorage{Driver: "overlay2", BackingFS: "extfs", RuntimeArgs: map[string][]string{"runsc": {"--oci-seccomp"}}}, true)

	hc := &container.HostConfig{SecurityOpt: []string{"no-new-privileges:true"}}
	if err := applyStorage(&Config{storage: watch}, hc, 64<<20, ""); err != nil {
		t.Fatal(err)
	}
	if len(hc.SecurityOpt) != 2 || !strings.HasPrefix(hc.SecurityOpt[1], "seccomp={") || hc.StorageOpt != nil {
		t.Errorf("watch mode: security options %.80q, storage options %v", hc.SecurityOpt, hc.StorageOpt)
	}
	if hc.LogConfig.Type != "json-file" || hc.LogConfig.Config["max-size"] != logMaxSize || hc.LogConfig.Config["max-file"] != logFiles {
		t.Errorf("watch mode: log config %+v, want json-file capped", hc.LogConfig)
	}

	// The engine bounds the writable layer; volumes are still measured,
	// so fallocate is refused there too, and gVisor without its seccomp.
	hc = &container.HostConfig{}
	if err := applyStorage(&Config{storage: engine}, hc, 64<<20, ""); err != nil {
		t.Fatal(err)
	}
	if hc.StorageOpt["size"] != "67108864" || len(hc.SecurityOpt) != 1 || !strings.HasPrefix(hc.SecurityOpt[0], "seccomp={") || hc.LogConfig.Type != "" {
		t.Errorf("engine mode: storage options %v, security options %.80q, log %+v", hc.StorageOpt, hc.SecurityOpt, hc.LogConfig)
	}
	if err := applyStorage(&Config{storage: engine}, &container.HostConfig{}, 64<<20, "runsc"); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("engine mode, gVisor without --oci-seccomp: %v, want a refusal", err)
	}

	for name, cfg := range map[string]*Config{"no policy": {}, "vfs": {storage: none}} {
		err := applyStorage(cfg, &container.HostConfig{}, 1<<30, "")
		if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "cannot enforce") {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
	err := applyStorage(&Config{storage: watch}, &container.HostConfig{}, 1<<30, "runsc")
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "--oci-seccomp") {
		t.Errorf("gVisor without --oci-seccomp: %v, want a refusal that says what to do", err)
	}
	if err := applyStorage(&Config{storage: gvisor}, &container.HostConfig{}, 1<<30, "runsc"); err != nil {
		t.Errorf("gVisor with --oci-seccomp: %v", err)
	}
}

// TestContainerStorage: the limit, the request's or the default, is
// written in a label (empty without one) and applied.
func TestContainerStorage(t *testing.T) {
	watch, _ := storagePolicyFor(engineStorage{Driver: "overlay2", BackingFS: "extfs"}, true)
	cfg := DefaultConfig()
	cfg.storage = watch
	spec := &sandbox.Spec{Image: "img", Entrypoint: []string{"x"}}
	for _, c := range []struct {
		def   string
		own   int64
		label string
	}{{"", 0, ""}, {"", 64 << 20, "67108864"}, {"1Gi", 0, "1073741824"}, {"1Gi", 1 << 20, "1048576"}} {
		cfg.DefaultStorage = c.def
		spec.Resources.StorageBytes = c.own
		cc, hc, _, err := containerConfig(&cfg, "id", spec, time.Now(), "tok", "")
		if err != nil {
			t.Fatal(err)
		}
		label, ok := cc.Labels[labelStorage]
		if !ok || label != c.label {
			t.Errorf("default %q, own %d: label %q (present %v), want %q", c.def, c.own, label, ok, c.label)
		}
		if seccomped := slices.ContainsFunc(hc.SecurityOpt, func(o string) bool { return strings.HasPrefix(o, "seccomp=") }); seccomped != (c.label != "") {
			t.Errorf("default %q, own %d: seccomp profile set %v", c.def, c.own, seccomped)
		}
	}
}

func TestCheckInterval(t *testing.T) {
	const mi = 1 << 20
	for _, c := range []struct {
		name        string
		limit, used int64
		rate        float64
		cost        time.Duration
		min, max    time.Duration
	}{
		{"small limit, empty", 64 * mi, 0, 0, 0, 14 * time.Millisecond, 17 * time.Millisecond},
		{"at the limit", 64 * mi, 64 * mi, 0, 0, minCheckInterval, minCheckInterval},
		{"over the limit", 64 * mi, 65 * mi, 0, 0, minCheckInterval, minCheckInterval},
		{"large limit, idle", 100 << 30, 0, 0, 0, maxCheckInterval, maxCheckInterval},
		{"large limit, half full", 10 << 30, 5 << 30, 0, 0, 1200 * time.Millisecond, 1300 * time.Millisecond},
		{"growing faster than assumed", 10 << 30, 5 << 30, 4 << 30, 0, 600 * time.Millisecond, 650 * time.Millisecond},
		{"costly to measure", 64 * mi, 0, 0, 50 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond},
		{"costly beyond the longest interval", 100 << 30, 0, 0, 2 * time.Second, 20 * time.Second, 20 * time.Second},
	} {
		got := checkInterval(c.limit, c.used, c.rate, c.cost)
		if got < c.min || got > c.max {
			t.Errorf("%s: checkInterval = %v, want %v..%v", c.name, got, c.min, c.max)
		}
	}
}

func TestGrowthRate(t *testing.T) {
	if got := growthRate(0, 100<<20, time.Second); got != 100<<20 {
		t.Errorf("first growth: %v", got)
	}
	if got := growthRate(100<<20, 0, time.Second); got != 50<<20 {
		t.Errorf("a pause halves the rate: %v", got)
	}
	if got := growthRate(100<<20, -(50 << 20), time.Second); got != 50<<20 {
		t.Errorf("shrinking: %v", got)
	}
	if got := growthRate(10, 1<<30, 0); got != 5 {
		t.Errorf("no time passed: %v", got)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{512: "512 B", 64 << 20: "64 MiB", 3 << 29: "1.5 GiB", 70*(1<<20) + 1<<19: "70.5 MiB", 1 << 40: "1 TiB", 32<<20 + 12<<10: "32.01 MiB", 10 << 30: "10 GiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
