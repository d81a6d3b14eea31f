package docker

import (
	"archive/tar"
	"io"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/sandbox"
)

// TestCAArchive: the CA alone, the bundle of the image's roots and the
// CA, and the image's own bundle with the CA appended, once; an image
// without roots gets a bundle of the CA alone and nothing else changed.
func TestCAArchive(t *testing.T) {
	ca := []byte("-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n")
	roots := []byte("-----BEGIN CERTIFICATE-----\nROOT\n-----END CERTIFICATE-----")
	files := func(sys []byte, path string) map[string]string {
		t.Helper()
		r, err := caArchive(ca, sys, path, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return out
			} else if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(tr)
			out["/"+h.Name] = string(b)
		}
	}
	got := files(roots, "/etc/pki/tls/certs/ca-bundle.crt")
	want := string(roots) + "\n" + string(ca)
	if got[sandbox.CredentialCAFile] != string(ca) || got[sandbox.CredentialCABundle] != want || got["/etc/pki/tls/certs/ca-bundle.crt"] != want || len(got) != 3 {
		t.Errorf("with roots: %q", got)
	}
	// Installed before (a restart): the image's bundle already holds it.
	if got := files([]byte(want), "/etc/pki/tls/certs/ca-bundle.crt"); len(got) != 2 {
		t.Errorf("the CA appended twice: %q", got)
	}
	if got := files(nil, ""); got[sandbox.CredentialCABundle] != string(ca) || len(got) != 2 {
		t.Errorf("without roots: %q", got)
	}
}
