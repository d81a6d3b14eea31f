package sdk_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/opensandbox/opensandbox/internal/testexecd"
	"github.com/opensandbox/opensandbox/sdk"
)

// execdSandbox runs a real execd in-process, serving dir, behind a
// lifecycle stub that gives its endpoint, and returns the SDK's view of
// it.
func execdSandbox(t *testing.T) (*sdk.Sandbox, string) {
	t.Helper()
	const token = "lines-token"
	dir := t.TempDir()
	ep := testexecd.Start(t, token)
	lifecycle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(ep)
	}))
	t.Cleanup(lifecycle.Close)
	c, err := sdk.NewClient(sdk.Config{Domain: lifecycle.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.Sandbox("sb"), dir
}

func TestReadLines(t *testing.T) {
	sb, dir := execdSandbox(t)
	ctx := t.Context()
	path := filepath.Join(dir, "f.txt")
	os.WriteFile(path, []byte("one\r\ntwo\nthree\nfour"), 0o644)

	for _, tt := range []struct {
		name          string
		offset, limit int64
		want          string
	}{
		{"window", 2, 2, "two\nthree\n"},
		{"CRLF kept", 1, 1, "one\r\n"},
		{"to the end, no final newline", 3, 0, "three\nfour"},
		{"from the start", 0, 1, "one\r\n"},
		{"whole", 0, 0, "one\r\ntwo\nthree\nfour"},
		{"past the end", 9, 1, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := sb.ReadLines(ctx, path, tt.offset, tt.limit)
			if err != nil || got != tt.want {
				t.Fatalf("ReadLines(%d, %d) = %q, %v; want %q", tt.offset, tt.limit, got, err, tt.want)
			}
		})
	}

	t.Run("stream", func(t *testing.T) {
		fr, err := sb.DownloadLines(ctx, path, 2, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer fr.Close()
		data, err := io.ReadAll(fr)
		if err != nil || string(data) != "two\n" || fr.ModTime.IsZero() {
			t.Fatalf("%q %v, modified %v", data, err, fr.ModTime)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		if _, err := sb.ReadLines(ctx, filepath.Join(dir, "nope"), 1, 1); !errors.Is(err, sdk.ErrNotFound) {
			t.Fatalf("err %v, want not found", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		if _, err := sb.ReadLines(ctx, dir, 1, 1); !errors.Is(err, sdk.ErrInvalid) {
			t.Fatalf("err %v, want invalid", err)
		}
	})
	t.Run("negative", func(t *testing.T) {
		if _, err := sb.ReadLines(ctx, path, -1, 1); !errors.Is(err, sdk.ErrInvalid) {
			t.Fatalf("err %v, want invalid", err)
		}
	})
}
