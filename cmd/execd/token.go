package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// tokenFDFlag names the descriptor hideToken passes the token in.
const tokenFDFlag = "access-token-fd"

// hideToken re-executes execd without the access token in its arguments
// and environment when it is found there, passing it instead in an
// anonymous memory file whose descriptor number is given with
// --access-token-fd. The process keeps its pid (it stays PID 1), and
// /proc/1/cmdline and /proc/1/environ, which every process of the sandbox
// can read, no longer show the token. It returns only when there is
// nothing to hide or the re-execution failed.
func hideToken(argv, env []string) error {
	args, token, found := stripTokenArgs(argv[1:])
	var cleanEnv []string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "EXECD_ACCESS_TOKEN="); ok {
			if !found {
				token, found = v, true
			}
			continue
		}
		cleanEnv = append(cleanEnv, kv)
	}
	if !found {
		return nil
	}
	fd, err := unix.MemfdCreate("execd-token", 0) // inherited across exec on purpose
	if err != nil {
		return err
	}
	if _, err := unix.Write(fd, []byte(token)); err != nil {
		unix.Close(fd)
		return err
	}
	self, err := os.Executable()
	if err != nil {
		unix.Close(fd)
		return err
	}
	newArgs := append([]string{argv[0], "--" + tokenFDFlag + "=" + strconv.Itoa(fd)}, args...)
	err = syscall.Exec(self, newArgs, cleanEnv)
	unix.Close(fd)
	return fmt.Errorf("re-execute %s: %w", self, err)
}

// stripTokenArgs removes --access-token (any of the flag package's forms)
// from the flags, leaving everything after "--" alone, and returns the
// token it held.
func stripTokenArgs(args []string) (out []string, token string, found bool) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...), token, found
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "access-token" {
			out = append(out, a)
			continue
		}
		if !hasValue {
			if i+1 == len(args) {
				out = append(out, a) // let flag parsing report it
				continue
			}
			i++
			value = args[i]
		}
		token, found = value, true
	}
	return out, token, found
}

// readTokenFD reads the token from the memory file hideToken made, and
// closes it.
func readTokenFD(fd int) (string, error) {
	f := os.NewFile(uintptr(fd), "access-token")
	if f == nil {
		return "", fmt.Errorf("descriptor %d is not open", fd)
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
	if err != nil {
		return "", err
	}
	return string(b), nil
}
