package sdk_test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testserver"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/sdk"
)

// Images the tests use; make images builds them.
const (
	busyboxImage = "opensandbox/busybox"
	pythonImage  = "opensandbox/python:3.11"
)

// server is the lifecycle server the tests and examples share, on the
// local Docker engine; its address and key are in the OPEN_SANDBOX_*
// variables, as a user would have them.
var server *testserver.Server

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if err := exec.Command("docker", "image", "inspect", busyboxImage, pythonImage).Run(); err != nil {
		if testenv.Required() {
			fmt.Fprintf(os.Stderr, "sdk tests need Docker and the local images (make images): %v\n", err)
			return 1
		}
		// The examples cannot skip themselves: run only the tests, which do.
		if f := flag.Lookup("test.run"); f.Value.String() == "" {
			f.Value.Set("^Test")
		}
		return m.Run()
	}
	var err error
	server, err = testserver.New(testserver.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer server.Close()
	os.Setenv(sdk.EnvDomain, server.Addr)
	os.Setenv(sdk.EnvAPIKey, server.APIKey)
	os.Unsetenv(sdk.EnvProtocol)
	os.Unsetenv(sdk.EnvRequestTimeout)
	os.Unsetenv(sdk.EnvUseServerProxy)
	return m.Run()
}

// newClient returns a client of the shared server; the test is skipped
// (or fails in CI) without Docker.
func newClient(t *testing.T, mod ...func(*sdk.Config)) *sdk.Client {
	t.Helper()
	if server == nil {
		testenv.MustHaveImage(t, pythonImage)
		t.Fatal("the shared server did not start")
	}
	cfg := sdk.Config{Domain: server.Addr, APIKey: server.APIKey}
	for _, f := range mod {
		f(&cfg)
	}
	c, err := sdk.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// newSandbox creates a sandbox for one test and kills it afterwards.
func newSandbox(t *testing.T, c *sdk.Client, opts sdk.CreateOptions) *sdk.Sandbox {
	t.Helper()
	if opts.Image == "" && opts.SnapshotID == "" {
		opts.Image = busyboxImage
	}
	if opts.ReadyTimeout == 0 {
		// The SDK's wait, the longer of its default and what two starts
		// may take on this machine (see testwait).
		opts.ReadyTimeout = max(sdk.DefaultReadyTimeout, testwait.TimeoutN(2))
	}
	sb, err := c.Create(t.Context(), opts)
	if err != nil {
		t.Fatalf("create: %v (a cold container start takes %v here now)\n%s", err, testwait.Pace(), testwait.Containers("label=opensandbox.scope="+server.Scope))
	}
	t.Cleanup(func() {
		ctx, cancel := contextWithTimeout(30 * time.Second)
		defer cancel()
		sb.Kill(ctx)
	})
	return sb
}
