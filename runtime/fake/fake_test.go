package fake_test

import (
	"testing"

	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/runtime/runtimetest"
	"github.com/opensandbox/opensandbox/sandbox"
)

func TestConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) sandbox.Runtime {
		rt := fake.New()
		rt.MissingImages["missing:latest"] = true
		return rt
	}, runtimetest.Options{Image: "busybox", Entrypoint: []string{"sleep", "1000"}, MissingImage: "missing:latest"})
}
