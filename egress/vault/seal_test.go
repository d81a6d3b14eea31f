package vault

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/egress"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

func TestSealRoundTrip(t *testing.T) {
	v1 := mustCreate(t, baseVault, testOptions(t))
	v2, err := v1.Mutate(mutationReq(t, `{"credentials":{"add":[{"name":"later","source":{"value":"later-SECRET"}}]}}`), testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	key := testKey(7)
	sealed, err := Seal(key, v2, "sandbox-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"ghp_SECRET1", "key-SECRET2", "later-SECRET", "SECRET", "gh-token", "api.github.test"} {
		if bytes.Contains(sealed, []byte(secret)) {
			t.Errorf("sealed data holds %q in the clear", secret)
		}
	}
	got, err := Open(key, sealed, "sandbox-1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.State(), v2.State()) {
		t.Errorf("opened state =\n%+v\nwant\n%+v", got.State(), v2.State())
	}
	if !reflect.DeepEqual(got.Secrets(), v2.Secrets()) {
		t.Errorf("opened secrets differ")
	}
	req := egress.BindRequest{Scheme: "https", Host: "x.example.test", Port: 443, Method: "GET", Path: "/v1/a"}
	a, errA := got.Bind(req)
	b, errB := v2.Bind(req)
	if errA != nil || errB != nil || !reflect.DeepEqual(a, b) {
		t.Errorf("opened vault binds %+v %v, original %+v %v", a, errA, b, errB)
	}
	// Two seals of the same vault differ (random nonce).
	again, _ := Seal(key, v2, "sandbox-1")
	if bytes.Equal(again, sealed) {
		t.Error("two seals are identical")
	}
}

func TestOpenRefuses(t *testing.T) {
	v := mustCreate(t, baseVault, testOptions(t))
	key := testKey(1)
	sealed, err := Seal(key, v, "ctx")
	if err != nil {
		t.Fatal(err)
	}
	flip := func(i int) []byte {
		d := bytes.Clone(sealed)
		d[i] ^= 0x01
		return d
	}
	blob, err := SealBytes(key, []byte("not a vault"), "ctx")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		key  []byte
		data []byte
		aad  string
		want string
		is   error
	}{
		{"wrong key", testKey(2), sealed, "ctx", "wrong key", ErrUnseal},
		{"wrong aad", key, sealed, "other", "wrong key", ErrUnseal},
		{"tampered ciphertext", key, flip(len(sealed) - 20), "ctx", "wrong key", ErrUnseal},
		{"tampered tag", key, flip(len(sealed) - 1), "ctx", "wrong key", ErrUnseal},
		{"tampered nonce", key, flip(headerSize), "ctx", "wrong key", ErrUnseal},
		{"tampered header", key, flip(0), "ctx", "bad header", nil},
		{"other version", key, append([]byte(sealMagic+"\x02"), sealed[headerSize:]...), "ctx", "format version 2", nil},
		{"truncated", key, sealed[:headerSize+5], "ctx", "too short", nil},
		{"empty", key, nil, "ctx", "bad header", nil},
		{"short key", key[:16], sealed, "ctx", "16 bytes, want 32", nil},
		{"a blob sealed as bytes", key, blob, "ctx", "wrong key", ErrUnseal},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Open(c.key, c.data, c.aad)
			if err == nil || !strings.Contains(err.Error(), c.want) || c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("Open = %v, %v; want an error containing %q", got, err, c.want)
			}
		})
	}
	// A vault cannot be opened as bytes under the same context either.
	if _, err := OpenBytes(key, sealed, "ctx"); !errors.Is(err, ErrUnseal) {
		t.Errorf("OpenBytes of a sealed vault = %v, want ErrUnseal", err)
	}
	if _, err := Seal(key, nil, "ctx"); err == nil {
		t.Error("Seal(nil) succeeded")
	}
}

func TestSealBytes(t *testing.T) {
	key := testKey(3)
	plain := []byte("-----BEGIN EC PRIVATE KEY----- ca key")
	sealed, err := SealBytes(key, plain, "ca")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("PRIVATE")) {
		t.Error("sealed bytes hold the plaintext")
	}
	got, err := OpenBytes(key, sealed, "ca")
	if err != nil || !bytes.Equal(got, plain) {
		t.Errorf("OpenBytes = %q, %v", got, err)
	}
	if _, err := OpenBytes(key, sealed, "vault"); !errors.Is(err, ErrUnseal) {
		t.Errorf("OpenBytes with another aad = %v", err)
	}
	if _, err := SealBytes(key[:31], plain, "ca"); err == nil {
		t.Error("SealBytes with a 31-byte key succeeded")
	}
}

func TestFileStore(t *testing.T) {
	dir := t.TempDir()
	s := &FileStore{Path: filepath.Join(dir, "vault.sealed"), Key: testKey(9), AAD: "sb"}
	if v, ok, err := s.Load(); v != nil || ok || err != nil {
		t.Fatalf("Load of no file = %v, %v, %v", v, ok, err)
	}
	v := mustCreate(t, baseVault, testOptions(t))
	if err := s.Save(v); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(s.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v, want 0600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(s.Path)
	if bytes.Contains(data, []byte("SECRET")) {
		t.Error("the file holds a value in the clear")
	}
	got, ok, err := s.Load()
	if err != nil || !ok || !reflect.DeepEqual(got.State(), v.State()) {
		t.Fatalf("Load = %+v, %v, %v", got, ok, err)
	}
	// Saved twice: still one file, no temporary left behind.
	if err := s.Save(v); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after two saves, want 1", len(entries))
	}
	// Another key or context cannot load it.
	other := &FileStore{Path: s.Path, Key: testKey(8), AAD: "sb"}
	if _, _, err := other.Load(); !errors.Is(err, ErrUnseal) {
		t.Errorf("Load with another key = %v, want ErrUnseal", err)
	}
	// Save(nil) removes the file, and is idempotent.
	if err := s.Save(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Path); !os.IsNotExist(err) {
		t.Errorf("file after Save(nil): %v", err)
	}
	if err := s.Save(nil); err != nil {
		t.Errorf("second Save(nil) = %v", err)
	}
	// A directory that does not exist fails cleanly.
	bad := &FileStore{Path: filepath.Join(dir, "missing", "v"), Key: testKey(9)}
	if err := bad.Save(v); err == nil {
		t.Error("Save into a missing directory succeeded")
	}
}
