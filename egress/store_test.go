package egress

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestFileStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := NewFileStore(filepath.Join(dir, "policy.json"))
	initial := Policy{DefaultAction: ActionAllow, Egress: rules("deny", "x.test")}

	// No file: the initial policy.
	if _, ok, err := s.Load(); ok || err != nil {
		t.Fatalf("Load of a missing file = %v, %v", ok, err)
	}
	if got, err := s.LoadOr(initial); err != nil || !got.Equal(initial) {
		t.Fatalf("LoadOr with no file = %+v, %v", got, err)
	}
	// An empty or blank file: the initial policy.
	if err := os.WriteFile(s.Path(), []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LoadOr(initial); err != nil || !got.Equal(initial) {
		t.Fatalf("LoadOr with a blank file = %+v, %v", got, err)
	}
	// A saved policy wins over the initial one, even deny-all.
	for _, p := range []Policy{
		{DefaultAction: ActionDeny, Egress: rules("allow", "a.test", "allow", "*.b.test", "deny", "10.0.0.0/8", "allow", "2001:db8::1")},
		DenyAll(),
	} {
		if err := s.Save(p); err != nil {
			t.Fatal(err)
		}
		got, err := s.LoadOr(initial)
		if err != nil || !got.Equal(p) {
			t.Errorf("LoadOr after Save(%+v) = %+v, %v", p, got, err)
		}
	}
	data, err := os.ReadFile(s.Path())
	if err != nil || !strings.Contains(string(data), `"egress":[]`) {
		t.Errorf("file holds %q (%v), want the API's shape", data, err)
	}
	if fi, err := os.Stat(s.Path()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v (%v), want 0600", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after saves, want only the policy file", len(entries))
	}
	// A corrupt file is an error, not a silent reset.
	if err := os.WriteFile(s.Path(), []byte(`{"egress":[`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LoadOr(initial); err == nil {
		t.Error("LoadOr of a corrupt file succeeded")
	}
}

func TestFileStoreSaveFails(t *testing.T) {
	dir := t.TempDir()
	// The path is a directory: the rename fails, and no temporary file is
	// left behind.
	target := filepath.Join(dir, "policy.json")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := NewFileStore(target).Save(DenyAll()); err == nil {
		t.Fatal("Save over a non-empty directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("a failed Save left %d entries, want 1", len(entries))
	}
	if err := NewFileStore(filepath.Join(dir, "no", "policy.json")).Save(DenyAll()); err == nil {
		t.Error("Save into a missing directory succeeded")
	}
}

// TestFileStoreNeverHalfWritten saves policies of very different sizes
// while readers read the file: every read is a whole policy, one of
// those saved.
func TestFileStoreNeverHalfWritten(t *testing.T) {
	s := NewFileStore(filepath.Join(t.TempDir(), "policy.json"))
	small := Policy{DefaultAction: ActionDeny, Egress: rules("allow", "a.test")}
	large := Policy{DefaultAction: ActionAllow, Egress: make([]Rule, 0, 2000)}
	for i := range 2000 {
		large.Egress = append(large.Egress, Rule{Action: ActionDeny, Target: fmt.Sprintf("host-%d.example.test", i)})
	}
	if err := s.Save(small); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	errs := make(chan error, 4)
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				p, ok, err := s.Load()
				if err != nil || !ok {
					errs <- fmt.Errorf("Load during saves: ok=%v err=%v", ok, err)
					return
				}
				if !p.Equal(small) && !p.Equal(large) {
					errs <- fmt.Errorf("Load during saves returned a policy never saved (%d rules)", len(p.Egress))
					return
				}
			}
		})
	}
	for i := range 40 {
		p := small
		if i%2 == 0 {
			p = large
		}
		if err := s.Save(p); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
