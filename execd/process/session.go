package process

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// SignalSession sends sig to every process of the session sid, whatever
// process group it is in: a terminal's shell puts each job in a group of
// its own, and killing only the shell's group would leave its background
// jobs running. It returns the number of processes signalled.
func SignalSession(sid int, sig syscall.Signal) int {
	if sid <= 1 {
		return 0
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, ok := sessionOf(pid); ok && s == sid {
			if syscall.Kill(pid, sig) == nil {
				n++
			}
		}
	}
	return n
}

// sessionOf reads the session id of pid from /proc/<pid>/stat.
func sessionOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name may hold spaces and parentheses; fields resume
	// after the last ')': state, ppid, pgrp, session.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 {
		return 0, false
	}
	sid, err := strconv.Atoi(string(f[3]))
	return sid, err == nil
}
