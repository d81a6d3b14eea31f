package mcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/sdk"
)

// FileURITemplate names a file of a sandbox as a resource:
// sandbox://SANDBOX_ID/files/tmp/notes.txt is /tmp/notes.txt.
const FileURITemplate = "sandbox://{sandbox_id}/files/{+path}"

// maxResourceBytes bounds a file read as a resource.
const maxResourceBytes = 4 << 20

// FileURI is the resource URI of the file at absolute path p in sandbox
// id.
func FileURI(id, p string) string {
	u := url.URL{Scheme: "sandbox", Host: id, Path: "/files/" + strings.TrimPrefix(p, "/")}
	return u.String()
}

// parseFileURI is the inverse of FileURI.
func parseFileURI(uri string) (id, p string, err error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", "", err
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(uri, "#") {
		return "", "", fmt.Errorf("%q has a '?' or '#': write them in a path as %%3F and %%23", uri)
	}
	rest, ok := strings.CutPrefix(u.Path, "/files/")
	if u.Scheme != "sandbox" || u.Host == "" || !ok || rest == "" {
		return "", "", fmt.Errorf("want sandbox://SANDBOX_ID/files/PATH, got %q", uri)
	}
	return u.Host, "/" + rest, nil
}

func (s *Server) addResources() {
	s.srv.AddResourceTemplate(&gomcp.ResourceTemplate{
		Name:        "sandbox-file",
		Title:       "File in a sandbox",
		Description: "A file of a sandbox, by sandbox id and absolute path: sandbox://SANDBOX_ID/files/etc/hostname is /etc/hostname. Text files come back as text, others as binary blobs, up to 4 MiB; write a ? or # in a path as %3F or %23.",
		URITemplate: FileURITemplate,
	}, s.readFileResource)
}

func (s *Server) readFileResource(ctx context.Context, req *gomcp.ReadResourceRequest) (_ *gomcp.ReadResourceResult, err error) {
	uri := req.Params.URI
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("resource read panicked", "uri", uri, "panic", p)
			err = fmt.Errorf("internal error reading %s: %v", uri, p)
		}
	}()
	id, p, err := parseFileURI(uri)
	if err != nil {
		return nil, err
	}
	sb, err := s.running(ctx, id)
	if err != nil {
		return nil, errors.New(s.explain(err, id))
	}
	info, err := stat(ctx, sb, p)
	if errors.Is(err, sdk.ErrNotFound) {
		return nil, gomcp.ResourceNotFoundError(uri)
	} else if err != nil {
		return nil, errors.New(s.explain(err, id))
	}
	if info.Type == "directory" {
		return nil, fmt.Errorf("%s is a directory; list it with the file_list tool", p)
	}
	if info.Size > maxResourceBytes {
		return nil, fmt.Errorf("%s has %d bytes, more than the %d a resource may have; read it in parts with the file_read tool", p, info.Size, maxResourceBytes)
	}
	// One byte more than allowed: a file reached through a symbolic link
	// has the link's size in info, so only the read tells its own.
	data, err := readRange(ctx, sb, p, 0, maxResourceBytes+1)
	if err != nil {
		return nil, errors.New(s.explain(err, id))
	}
	if len(data) > maxResourceBytes {
		return nil, fmt.Errorf("%s has more than the %d bytes a resource may have; read it in parts with the file_read tool", p, maxResourceBytes)
	}
	rc := &gomcp.ResourceContents{URI: uri, MIMEType: http.DetectContentType(data)}
	if looksText(data) {
		rc.Text = string(data)
		if strings.HasPrefix(rc.MIMEType, "application/octet-stream") {
			rc.MIMEType = "text/plain; charset=utf-8"
		}
	} else {
		rc.Blob = data
	}
	return &gomcp.ReadResourceResult{Contents: []*gomcp.ResourceContents{rc}}, nil
}
