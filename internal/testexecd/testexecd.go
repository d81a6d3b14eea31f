// Package testexecd runs a real execd inside a test's process, for tests of
// clients that need one without containers.
package testexecd

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd"
)

// Start runs a real execd in the test's process on loopback,
// with token as its access token, and returns the endpoint a lifecycle
// server would give for it (host:port and the token header). It stops
// when the test ends.
func Start(t testing.TB, token string) api.Endpoint {
	t.Helper()
	srv, err := execd.New(execd.Config{AccessToken: token, TempDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Shutdown(time.Second)
	})
	return api.Endpoint{Endpoint: strings.TrimPrefix(hs.URL, "http://"), Headers: map[string]string{api.HeaderExecdToken: token}}
}
