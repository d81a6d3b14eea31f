package docker

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestStoreHeldByAnotherServer: a state database another server has open
// is refused with a message that says so, once the lock wait runs out.
func TestStoreHeldByAnotherServer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	first, err := openStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.close()
	second, err := openStore(path)
	if err == nil {
		second.close()
		t.Fatal("a second store opened a database the first holds")
	}
	if !strings.Contains(err.Error(), "another server holds it") {
		t.Fatalf("second open: %v, want it to say another server holds the database", err)
	}
}
