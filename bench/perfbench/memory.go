package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// footprint is the memory of idle containers, mean per container, in
// bytes.
type footprint struct {
	// cgroup is what the container's memory cgroup holds: on cgroup v1
	// memory.usage_in_bytes, on v2 memory.current. That is every page
	// charged to the container: the anonymous memory of its processes
	// (execd and its child, or the baseline's sleep), the page cache it
	// brought in (the part of execd's binary it was the first to read,
	// its files) and the kernel's memory for it.
	cgroup float64
	// initRSS and initAnon are VmRSS and RssAnon of the container's init
	// (execd in a sandbox, sleep in the baseline).
	initRSS, initAnon float64
	// shimPSS is the proportional set size of the container's
	// containerd-shim, which lives outside the container's cgroup: what
	// the engine spends per container besides it.
	shimPSS float64
}

// total is what one more idle container costs: its cgroup and its shim.
func (f footprint) total() float64 { return f.cgroup + f.shimPSS }

// measureFootprint reads the footprint of each container and returns the
// mean.
func measureFootprint(ctx context.Context, cids []string) (footprint, error) {
	if len(cids) == 0 {
		return footprint{}, errors.New("no containers to measure")
	}
	out, err := docker(ctx, append([]string{"inspect", "-f", "{{.State.Pid}}"}, cids...)...)
	if err != nil {
		return footprint{}, err
	}
	pids := strings.Fields(out)
	if len(pids) != len(cids) {
		return footprint{}, fmt.Errorf("docker inspect gave %d pids for %d containers", len(pids), len(cids))
	}
	var sum footprint
	for _, pid := range pids {
		cg, err := cgroupMemory(pid)
		if err != nil {
			return footprint{}, err
		}
		status, err := procFields("/proc/"+pid+"/status", "VmRSS", "RssAnon")
		if err != nil {
			return footprint{}, err
		}
		sum.cgroup += cg
		sum.initRSS += status["VmRSS"]
		sum.initAnon += status["RssAnon"]
		if shim, err := parentPID(pid); err == nil {
			if comm, _ := os.ReadFile("/proc/" + shim + "/comm"); strings.HasPrefix(string(comm), "containerd-shim") {
				rollup, err := procFields("/proc/"+shim+"/smaps_rollup", "Pss")
				if err == nil {
					sum.shimPSS += rollup["Pss"]
				}
			}
		}
	}
	n := float64(len(pids))
	return footprint{cgroup: sum.cgroup / n, initRSS: sum.initRSS / n, initAnon: sum.initAnon / n, shimPSS: sum.shimPSS / n}, nil
}

// cgroupMemory reads the memory charged to the cgroup of the process.
func cgroupMemory(pid string) (float64, error) {
	data, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return 0, fmt.Errorf("cgroup of %s: %w", pid, err)
	}
	var path string
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "": // cgroup v2
			path = filepath.Join("/sys/fs/cgroup", parts[2], "memory.current")
		case strings.Contains(","+parts[1]+",", ",memory,"): // cgroup v1
			path = filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.usage_in_bytes")
		default:
			continue
		}
		if parts[0] != "0" {
			break // v1's memory line wins over a hybrid system's v2 line
		}
	}
	if path == "" {
		return 0, fmt.Errorf("no memory cgroup for process %s", pid)
	}
	v, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("memory of process %s: %w", pid, err)
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(string(v)), 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// procFields reads "Name: N kB" fields of a /proc file, in bytes.
func procFields(path string, names ...string) (map[string]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	got := make(map[string]float64, len(names))
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		for _, want := range names {
			if name == want {
				kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", path, name, err)
				}
				got[name] = kb * 1024
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(got) != len(names) {
		return nil, fmt.Errorf("%s: found %d of the fields %v", path, len(got), names)
	}
	return got, nil
}

// parentPID is the parent of the process.
func parentPID(pid string) (string, error) {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", err
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	i := strings.LastIndex(string(data), ") ")
	if i < 0 {
		return "", fmt.Errorf("/proc/%s/stat: %q", pid, data)
	}
	fields := strings.Fields(string(data)[i+2:])
	if len(fields) < 2 {
		return "", fmt.Errorf("/proc/%s/stat: %q", pid, data)
	}
	return fields[1], nil
}
