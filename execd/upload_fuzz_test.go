package execd

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"log/slog"
	"maps"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

const fuzzBoundary = "fuzzb0undary"

// fuzzLimit is the MaxUploadBytes of the server FuzzUpload drives.
const fuzzLimit = 64 << 10

// fuzzUploadPart is one part FuzzUpload sends.
type fuzzUploadPart struct {
	name, filename string
	data           []byte
}

// decodeUploadProgram turns fuzz input into upload parts: every three
// bytes of prog pick a part kind and its parameters; data supplies file
// contents, part names and raw metadata. Paths stay inside root.
func decodeUploadProgram(s *Server, root string, prog, data []byte) []fuzzUploadPart {
	paths := []string{
		root + "/new", root + "/existing", root + "/link", root + "/dir", root + "/file/x", root + "/sub/deep/f",
		root + "/a/../b", root + "/dir/../../" + filepath.Base(root) + "/c", root + "/日本 ü", "", root + "/nul\x00",
		root + "/" + strings.Repeat("n", 300), root + "/dir/inner",
	}
	window := func(a, b byte) []byte {
		if len(data) == 0 {
			return nil
		}
		i, j := int(a)%len(data), int(b)%(len(data)+1)
		if i > j {
			i, j = j, i
		}
		return data[i:j]
	}
	var parts []fuzzUploadPart
	for len(prog) >= 3 && len(parts) < 12 {
		op, a, b := prog[0], prog[1], prog[2]
		prog = prog[3:]
		switch op % 8 {
		case 0, 1: // metadata, with or without a filename
			m := map[string]any{"path": paths[int(a)%len(paths)]}
			switch b % 10 {
			case 1:
				m["mode"] = 640
			case 2:
				m["mode"] = 4755
			case 3:
				m["mode"] = 999
			case 4:
				m["owner"], m["group"] = "root", "0"
			case 5:
				m["owner"] = "no-such-user-xyz"
			case 6:
				m["mode"] = -1
			}
			js, _ := json.Marshal(m)
			if b%10 == 7 {
				js = []byte(`{"path":`)
			}
			if b%10 == 8 {
				js = window(a, b)
				var fm api.FileMetadata
				if json.Unmarshal(js, &fm) == nil && fm.Path != "" {
					if p, err := s.resolvePath(fm.Path); err == nil && !strings.HasPrefix(p, root+"/") {
						js = []byte(`{"path":"` + root + `/raw"}`) // never let the fuzzer write elsewhere
					}
				}
			}
			filename := ""
			if op%8 == 0 {
				filename = "metadata"
			}
			parts = append(parts, fuzzUploadPart{"metadata", filename, js})
		case 2, 3, 4:
			parts = append(parts, fuzzUploadPart{"file", "blob", window(a, b)})
		case 5: // too large for the server's limit
			parts = append(parts, fuzzUploadPart{"file", "big", bytes.Repeat([]byte{a}, fuzzLimit+int(b))})
		case 6: // another form field
			name := string(window(a, b))
			if name == "metadata" || name == "file" {
				name = "other"
			}
			parts = append(parts, fuzzUploadPart{name, "", window(b, a)})
		case 7: // a file part with an odd filename
			parts = append(parts, fuzzUploadPart{"file", string(window(b, a)) + "\"ü", window(a, b)})
		}
	}
	return parts
}

func encodeUpload(parts []fuzzUploadPart) []byte {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	mw.SetBoundary(fuzzBoundary)
	for _, p := range parts {
		h := make(textproto.MIMEHeader)
		cd := "form-data; name=" + quoteParam(p.name)
		if p.filename != "" {
			cd += "; filename=" + quoteParam(p.filename)
		}
		h.Set("Content-Disposition", cd)
		w, _ := mw.CreatePart(h)
		w.Write(p.data)
	}
	mw.Close()
	return buf.Bytes()
}

func quoteParam(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\r", "", "\n", "").Replace(s) + `"`
}

// snapshotTree maps every path under root to its type and, for regular
// files, content.
func snapshotTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := make(map[string]string)
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return nil
		}
		v := d.Type().String()
		if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			v = "file:" + string(b)
		}
		out[p] = v
		return nil
	})
	return out
}

func FuzzUpload(f *testing.F) {
	base := f.TempDir()
	s, err := New(Config{Insecure: true, TempDir: f.TempDir(), MaxUploadBytes: fuzzLimit, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Shutdown(time.Second) })
	s.env.cwd, s.env.home = base, base
	h := s.Handler()

	f.Add([]byte{0, 0, 0, 2, 0, 5}, []byte("hello world"), uint16(0))                 // one pair
	f.Add([]byte{2, 0, 5, 1, 1, 1, 3, 1, 9, 0, 12, 2}, []byte("abcdefgh"), uint16(0)) // file first, two pairs
	f.Add([]byte{0, 0, 0, 2, 0, 5}, []byte("hello world"), uint16(200))               // truncated
	f.Add([]byte{0, 5, 0, 2, 0, 5, 0, 6, 0, 2, 1, 1}, []byte("xy"), uint16(0))        // new parents, dot-dot
	f.Add([]byte{0, 1, 0, 5, 0, 0}, []byte("z"), uint16(0))                           // too large
	f.Add([]byte{0, 3, 0, 2, 0, 1}, []byte("z"), uint16(0))                           // directory target
	f.Add([]byte{0, 0, 8, 2, 0, 1}, []byte(`{"path":"x","mode":700}`), uint16(0))     // raw metadata
	f.Add([]byte{6, 1, 2, 0, 0, 0, 7, 3, 1}, []byte("field"), uint16(0))              // other parts

	f.Fuzz(func(t *testing.T, prog, data []byte, cut uint16) {
		root, err := os.MkdirTemp(base, "r")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(root)
		writeFile(t, filepath.Join(root, "existing"), "old")
		writeFile(t, filepath.Join(root, "file"), "f")
		os.Mkdir(filepath.Join(root, "dir"), 0o755)
		os.Symlink("existing", filepath.Join(root, "link"))
		before := snapshotTree(t, root)

		parts := decodeUploadProgram(s, root, prog, data)
		body := encodeUpload(parts)
		truncated := cut != 0 && int(cut) < len(body)
		if truncated {
			body = body[:cut]
		}
		req := httptest.NewRequest(http.MethodPost, "/files/upload", bytes.NewReader(body))
		req.Header.Set("Content-Type", "multipart/form-data; boundary="+fuzzBoundary)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		if got := leftovers(t, root, s.priv); len(got) > 0 {
			t.Fatalf("temporary files left: %v", got)
		}
		var e api.ErrorResponse
		json.Unmarshal(rec.Body.Bytes(), &e)
		switch {
		case rec.Code == http.StatusOK:
		case rec.Code == http.StatusBadRequest && slices.Contains([]string{api.CodeInvalidFile, api.CodeInvalidFileContent, api.CodeInvalidFileMetadata}, e.Code):
		case rec.Code == http.StatusRequestEntityTooLarge && e.Code == api.CodeRequestTooLarge:
		default:
			t.Fatalf("status %d body %s", rec.Code, rec.Body)
		}
		after := snapshotTree(t, root)
		if rec.Code != http.StatusOK {
			if !maps.Equal(before, after) {
				t.Fatalf("failed upload (%d %s) changed the tree:\nbefore %v\nafter  %v", rec.Code, rec.Body, before, after)
			}
			return
		}
		if truncated && !bytes.Contains(body, []byte("\r\n--"+fuzzBoundary+"--")) {
			t.Fatalf("a body cut at %d bytes, before its close delimiter, was accepted", cut)
		}
		ambiguous := false
		for _, p := range parts {
			if bytes.Contains(p.data, []byte("--"+fuzzBoundary)) {
				ambiguous = true // the body does not say what the parts meant to
			}
		}
		if ambiguous {
			return
		}
		var metas, files [][]byte
		for _, p := range parts {
			switch p.name {
			case "metadata":
				metas = append(metas, p.data)
			case "file":
				files = append(files, p.data)
			}
		}
		if len(metas) != len(files) {
			t.Fatalf("accepted %d metadata and %d file parts", len(metas), len(files))
		}
		want := make(map[string]string)
		for i, m := range metas {
			var fm api.FileMetadata
			if err := json.Unmarshal(m, &fm); err != nil {
				t.Fatalf("accepted bad metadata %q", m)
			}
			p, err := s.resolvePath(fm.Path)
			if err != nil {
				t.Fatalf("accepted path %q: %v", fm.Path, err)
			}
			if real, err := filepath.EvalSymlinks(p); err == nil {
				p = real
			}
			want[p] = "file:" + string(files[i])
		}
		for p, v := range after {
			if w, ok := want[p]; ok {
				if v != w {
					t.Fatalf("%s holds %.40q, want %.40q", p, v, w)
				}
				continue
			}
			if before[p] != v && v != "d---------" {
				t.Fatalf("%s changed from %.40q to %.40q", p, before[p], v)
			}
		}
		for p := range want {
			if _, ok := after[p]; !ok {
				t.Fatalf("%s was not written", p)
			}
		}
	})
}
