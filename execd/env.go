package execd

import (
	"bufio"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync/atomic"
)

// privateEnv lists execd's own variables, which commands never see.
var privateEnv = map[string]bool{
	"EXECD_ACCESS_TOKEN": true,
}

// environment is what every process execd starts inherits.
type environment struct {
	base []string // execd's environment without privateEnv
	file string   // EXECD_ENVS file, re-read at every start
	home string   // execd user's home
	cwd  string   // execd's working directory
	// claimed holds the variables a pool claim added, set once.
	claimed atomic.Pointer[map[string]string]
}

func newEnvironment(file string) (*environment, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return nil, fmt.Errorf("working directory: %w", err)
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "/"
	}
	e := &environment{file: file, home: home, cwd: cwd}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !privateEnv[name] {
			e.base = append(e.base, kv)
		}
	}
	return e, nil
}

// build returns the environment of a new process: execd's own, then the
// EXECD_ENVS file, then the claim's variables, then extra, each overriding the one before; then the
// identity variables of u when it is set.
func (e *environment) build(extra map[string]string, u *identity) []string {
	vars := make(map[string]string, len(e.base)+len(extra)+4)
	order := make([]string, 0, len(e.base)+len(extra)+4)
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	for _, kv := range e.base {
		k, v, _ := strings.Cut(kv, "=")
		set(k, v)
	}
	if e.file != "" {
		// A file that cannot be read adds nothing; the daemon logged the
		// problem when it first read the file.
		entries, _ := readEnvFile(e.file, func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
		for _, kv := range entries {
			set(kv[0], kv[1])
		}
	}
	if claimed := e.claimed.Load(); claimed != nil {
		for k, v := range *claimed {
			set(k, v)
		}
	}
	for k, v := range extra {
		set(k, v)
	}
	if u != nil {
		set("HOME", u.home)
		set("USER", u.name)
		set("LOGNAME", u.name)
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		if privateEnv[k] {
			continue
		}
		env = append(env, k+"="+vars[k])
	}
	return env
}

// readEnvFile parses a KEY=VALUE file: blank lines and '#' comments are
// skipped, an "export " prefix and matching outer quotes are dropped, and
// $VAR in values expands from lookup and the entries before it.
func readEnvFile(path string, lookup func(string) (string, bool)) ([][2]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][2]string
	local := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		if !ok || !isVarName(k) {
			return out, fmt.Errorf("%s:%d: not KEY=VALUE", path, n)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		v = os.Expand(v, func(name string) string {
			if x, ok := local[name]; ok {
				return x
			}
			x, _ := lookup(name)
			return x
		})
		local[k] = v
		out = append(out, [2]string{k, v})
	}
	return out, sc.Err()
}

// identity is a user a command runs as.
type identity struct {
	uid, gid uint32
	groups   []uint32
	name     string
	home     string
}

// lookupIdentity resolves uid (and gid, when given) against the passwd and
// group files. A uid with no passwd entry runs with gid = uid unless gid is
// given, HOME=/ and USER set to the number.
func lookupIdentity(uid uint32, gid *uint32) *identity {
	id := &identity{uid: uid, gid: uid, name: strconv.FormatUint(uint64(uid), 10), home: "/"}
	if u, err := user.LookupId(id.name); err == nil {
		id.name = u.Username
		if u.HomeDir != "" {
			id.home = u.HomeDir
		}
		if g, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			id.gid = uint32(g)
		}
		if gids, err := u.GroupIds(); err == nil {
			for _, s := range gids {
				if g, err := strconv.ParseUint(s, 10, 32); err == nil {
					id.groups = append(id.groups, uint32(g))
				}
			}
		}
	}
	if gid != nil {
		id.gid = *gid
	}
	return id
}
