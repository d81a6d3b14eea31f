package warmpool

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/execd"
)

// TestCheckEntrypoint asks a real execd, in this process on loopback,
// about an entrypoint that could not start, one that ran and exited, and
// none; and checks that a wrong token or an execd that does not answer is
// an error of another kind, never taken for a start failure.
func TestCheckEntrypoint(t *testing.T) {
	const token = "entrypoint-check-token"
	start := func(t *testing.T, argv []string) (string, *execd.Server) {
		t.Helper()
		srv, err := execd.New(execd.Config{AccessToken: token, TempDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if argv != nil {
			srv.StartEntrypoint(argv)
		}
		hs := httptest.NewServer(srv.Handler())
		t.Cleanup(func() {
			hs.Close()
			srv.Shutdown(time.Second)
		})
		return hs.URL, srv
	}
	missing := filepath.Join(t.TempDir(), "no-such-program")
	ctx := context.Background()

	t.Run("could not start", func(t *testing.T) {
		err := CheckEntrypoint(ctx, http.DefaultClient, url(start(t, []string{missing, "arg"})), token)
		var ee *EntrypointError
		if !errors.As(err, &ee) || ee.Entrypoint != missing+" arg" || !strings.Contains(ee.Err, "no such file") ||
			!strings.Contains(err.Error(), missing) {
			t.Fatalf("CheckEntrypoint: %#v (%v), want an *EntrypointError naming %s and the missing file", err, err, missing)
		}
	})
	t.Run("ran and exited", func(t *testing.T) {
		base, srv := start(t, []string{"sh", "-c", "exit 255"})
		for deadline := time.Now().Add(10 * time.Second); srv.Entrypoint().Running(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the entrypoint did not exit within 10 s")
			}
		}
		if err := CheckEntrypoint(ctx, http.DefaultClient, base, token); err != nil {
			t.Fatalf("CheckEntrypoint: %v, want nil", err)
		}
	})
	t.Run("no entrypoint", func(t *testing.T) {
		if err := CheckEntrypoint(ctx, http.DefaultClient, url(start(t, nil)), token); err != nil {
			t.Fatalf("CheckEntrypoint: %v, want nil", err)
		}
	})
	t.Run("wrong token", func(t *testing.T) {
		err := CheckEntrypoint(ctx, http.DefaultClient, url(start(t, []string{missing})), "wrong")
		var ee *EntrypointError
		if err == nil || errors.As(err, &ee) || !strings.Contains(err.Error(), "401") {
			t.Fatalf("CheckEntrypoint with a wrong token: %v, want a 401 that is no *EntrypointError", err)
		}
	})
	t.Run("execd gone", func(t *testing.T) {
		hs := httptest.NewServer(http.NotFoundHandler())
		base := hs.URL
		hs.Close()
		err := CheckEntrypoint(ctx, http.DefaultClient, base, token)
		var ee *EntrypointError
		if err == nil || errors.As(err, &ee) {
			t.Fatalf("CheckEntrypoint of a closed port: %v, want an error that is no *EntrypointError", err)
		}
	})
}

func url(base string, _ *execd.Server) string { return base }
