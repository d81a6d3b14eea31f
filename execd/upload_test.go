package execd

import (
	"bytes"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"testing"

	"github.com/opensandbox/opensandbox/execd/fsops"
)

// mpart is one part of a multipart upload body built by tests.
type mpart struct {
	name     string // form name: "metadata", "file" or anything else
	filename string // "" sends no filename
	data     []byte
	reader   io.Reader // content streamed instead of data when set
}

func metaPart(json string) mpart {
	return mpart{name: "metadata", filename: "metadata", data: []byte(json)}
}
func filePart(content []byte) mpart {
	return mpart{name: "file", filename: "blob", data: content}
}

// writeParts writes parts as a multipart/form-data body to w and closes it.
func writeParts(mw *multipart.Writer, parts []mpart) error {
	for _, p := range parts {
		h := make(textproto.MIMEHeader)
		cd := fmt.Sprintf(`form-data; name=%q`, p.name)
		if p.filename != "" {
			cd += fmt.Sprintf(`; filename=%q`, p.filename)
		}
		h.Set("Content-Disposition", cd)
		if p.name == "metadata" {
			h.Set("Content-Type", "application/json")
		} else {
			h.Set("Content-Type", "application/octet-stream")
		}
		pw, err := mw.CreatePart(h)
		if err != nil {
			return err
		}
		src := p.reader
		if src == nil {
			src = bytes.NewReader(p.data)
		}
		if _, err := io.Copy(pw, src); err != nil {
			return err
		}
	}
	return mw.Close()
}

// multipartBody builds a whole upload body in memory.
func multipartBody(t testing.TB, parts ...mpart) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if err := writeParts(mw, parts); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), mw.FormDataContentType()
}

// streamBody returns a body that is written while it is read, so that
// huge uploads need no memory on the client side.
func streamBody(parts ...mpart) (io.ReadCloser, string) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() { pw.CloseWithError(writeParts(mw, parts)) }()
	return pr, mw.FormDataContentType()
}

// upload posts parts to /files/upload and returns the response.
func (c *testClient) upload(parts ...mpart) (*http.Response, []byte) {
	c.t.Helper()
	body, ct := multipartBody(c.t, parts...)
	req := c.request(http.MethodPost, "/files/upload", bytes.NewReader(body))
	req.Header.Set("Content-Type", ct)
	return c.do(req)
}

// leftovers lists temporary upload files under the given directories.
func leftovers(t testing.TB, dirs ...string) []string {
	t.Helper()
	var found []string
	for _, dir := range dirs {
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && fsops.IsTemp(d.Name()) {
				found = append(found, p)
			}
			return nil
		})
	}
	return found
}
