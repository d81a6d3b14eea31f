// Package e2e holds black-box tests of the built binaries: execd runs as
// the init process of real containers on the local Docker engine, reached
// through a port published on 127.0.0.1.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

// execdBin, serverBin, osbBin and ingressBin are the binaries built once
// for the whole package, side by side, as make build lays them out.
var execdBin, serverBin, osbBin, ingressBin string

// execdPort is execd's port as paths and arguments spell it.
var execdPort = strconv.Itoa(api.ExecdPort)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "osb-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	execdBin = filepath.Join(dir, "execd")
	serverBin = filepath.Join(dir, "opensandbox-server")
	osbBin = filepath.Join(dir, "osb")
	ingressBin = filepath.Join(dir, "osb-ingress")
	build := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "./cmd/execd", "./cmd/opensandbox-server", "./cmd/osb", "./cmd/osb-ingress")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}
