package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

// upload sends files with the metadata parts the OpenSandbox clients send.
func (c *container) upload(files map[string][]byte, meta map[string]api.FileMetadata) {
	c.t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for path, data := range files {
		m := meta[path]
		m.Path = path
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
		h.Set("Content-Type", "application/json")
		w, _ := mw.CreatePart(h)
		json.NewEncoder(w).Encode(m)
		fw, _ := mw.CreateFormFile("file", "blob")
		fw.Write(data)
	}
	mw.Close()
	resp := c.request("POST", "/files/upload", &body, "Content-Type", mw.FormDataContentType())
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("upload: %d %s", resp.StatusCode, data)
	}
}

func (c *container) download(path string, header ...string) (*http.Response, []byte) {
	c.t.Helper()
	resp := c.request("GET", "/files/download?path="+path, nil, header...)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, data
}

func TestFilesInContainer(t *testing.T) {
	for _, tc := range []struct {
		image string
		cmd   []string
	}{
		{pythonImage, []string{"sleep", "infinity"}},
		{noShellImage, []string{"busybox", "sleep", "1000000"}},
	} {
		t.Run(strings.ReplaceAll(tc.image, "/", "_"), func(t *testing.T) {
			c := startContainer(t, tc.image, nil, tc.cmd...)
			blob := make([]byte, 3<<20)
			rand.Read(blob)
			c.upload(map[string][]byte{"/workspace/data/blob.bin": blob, "/workspace/hello.txt": []byte("hello world\n")},
				map[string]api.FileMetadata{"/workspace/data/blob.bin": {Mode: 640, Owner: "nobody"}})

			resp, data := c.download("/workspace/data/blob.bin")
			if resp.StatusCode != 200 || !bytes.Equal(data, blob) {
				t.Fatalf("download: %d, %d bytes, equal %v", resp.StatusCode, len(data), bytes.Equal(data, blob))
			}
			resp, data = c.download("/workspace/data/blob.bin", "Range", "bytes=10-19")
			if resp.StatusCode != 206 || !bytes.Equal(data, blob[10:20]) || resp.Header.Get("Content-Range") != fmt.Sprintf("bytes 10-19/%d", len(blob)) {
				t.Fatalf("range: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Range"), data)
			}

			var info map[string]api.FileInfo
			c.call("GET", "/files/info?path=/workspace/data/blob.bin", nil, 200, &info)
			fi := info["/workspace/data/blob.bin"]
			if fi.Mode != 640 || fi.Owner != "nobody" || fi.Size != int64(len(blob)) || fi.Type != "file" {
				t.Fatalf("info %+v", fi)
			}
			var list []api.FileInfo
			c.call("GET", "/directories/list?path=/workspace&depth=2", nil, 200, &list)
			var names []string
			for _, e := range list {
				names = append(names, e.Path)
			}
			if strings.Join(names, ",") != "/workspace/data,/workspace/data/blob.bin,/workspace/hello.txt" {
				t.Fatalf("list: %v", names)
			}
			var found []api.FileInfo
			c.call("GET", "/files/search?path=/workspace&pattern=*.txt", nil, 200, &found)
			if len(found) != 1 || found[0].Path != "/workspace/hello.txt" {
				t.Fatalf("search: %+v", found)
			}
			c.call("POST", "/files/replace", map[string]api.ReplaceFileContentItem{"/workspace/hello.txt": {Old: "world", New: "sandbox"}}, 200, nil)
			c.call("POST", "/files/mv", []api.RenameFileItem{{Src: "/workspace/hello.txt", Dest: "/workspace/moved/hi.txt"}}, 200, nil)
			if _, data := c.download("/workspace/moved/hi.txt"); string(data) != "hello sandbox\n" {
				t.Fatalf("after replace and mv: %q", data)
			}
			c.call("DELETE", "/directories?path=/workspace", nil, 200, nil)
			c.call("GET", "/files/info?path=/workspace", nil, 404, nil)
		})
	}
}
