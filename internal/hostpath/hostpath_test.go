package hostpath

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWithin(t *testing.T) {
	for _, tt := range []struct {
		p, dir string
		want   bool
	}{
		{"/a/b", "/a", true},
		{"/a", "/a", true},
		{"/ab", "/a", false},
		{"/a", "/a/b", false},
		{"/anything", "/", true},
	} {
		if got := Within(tt.p, tt.dir); got != tt.want {
			t.Errorf("Within(%q, %q) = %v", tt.p, tt.dir, got)
		}
	}
}

func TestResolve(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(tmp, "real", "sub"), 0o755)
	os.Symlink(filepath.Join(tmp, "real"), filepath.Join(tmp, "link"))
	os.Symlink(filepath.Join(tmp, "nowhere"), filepath.Join(tmp, "dangling"))
	for _, tt := range []struct {
		p, want string
		ok      bool
	}{
		{filepath.Join(tmp, "link", "sub"), filepath.Join(tmp, "real", "sub"), true},
		{filepath.Join(tmp, "link", "new", "deeper"), filepath.Join(tmp, "real", "new", "deeper"), true},
		{filepath.Join(tmp, "missing"), filepath.Join(tmp, "missing"), true},
		{filepath.Join(tmp, "dangling", "x"), "", false},
	} {
		got, err := Resolve(tt.p)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("Resolve(%q) = %q, %v; want %q (ok %v)", tt.p, got, err, tt.want, tt.ok)
		}
	}
}
