package execd

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// resolvePath turns a path from a request into an absolute, clean path, as
// expandPath describes, relative to execd's working directory and home.
// Failures are 400 INVALID_REQUEST_BODY errors.
func (s *Server) resolvePath(p string) (string, error) {
	out, err := expandPath(p, s.env.home, s.env.cwd, os.LookupEnv)
	if err != nil {
		return "", httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "path %q: %v", p, err)
	}
	return out, nil
}

// resolveDir resolves a working directory from a request: it must exist
// and be a directory, else the answer is a 400.
func (s *Server) resolveDir(p string) (string, error) {
	dir, err := s.resolvePath(p)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "cwd %s is not an existing directory", p)
	}
	return dir, nil
}

var (
	errEmptyPath   = errors.New("empty path")
	errNULInPath   = errors.New("path contains a NUL byte")
	errUnsetVar    = errors.New("undefined variable")
	errBadVariable = errors.New("malformed variable reference")
)

// expandPath expands a path the way the reference daemon does: "~" and a
// leading "~/" name home; $NAME and ${NAME} expand from lookup, and an
// undefined NAME is an error; a '$' not followed by a name is kept as it
// is. The result is made absolute against cwd and cleaned, so "a/../b"
// names cwd/b. Paths are taken literally otherwise: inside a sandbox every
// path is the user's to name, so there is nothing to confine.
func expandPath(p, home, cwd string, lookup func(string) (string, bool)) (string, error) {
	if p == "" {
		return "", errEmptyPath
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errNULInPath
	}
	if p == "~" {
		p = home
	} else if strings.HasPrefix(p, "~/") {
		p = filepath.Join(home, p[2:])
	}
	if strings.IndexByte(p, '$') >= 0 {
		var err error
		if p, err = expandVars(p, lookup); err != nil {
			return "", err
		}
		if p == "" {
			return "", errEmptyPath
		}
		if strings.IndexByte(p, 0) >= 0 {
			return "", errNULInPath
		}
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(cwd, p)
	}
	return filepath.Clean(p), nil
}

func expandVars(p string, lookup func(string) (string, bool)) (string, error) {
	var b strings.Builder
	for i := 0; i < len(p); {
		c := p[i]
		if c != '$' || i+1 == len(p) {
			b.WriteByte(c)
			i++
			continue
		}
		var name string
		next := i + 1
		if p[next] == '{' {
			end := strings.IndexByte(p[next:], '}')
			if end < 0 {
				return "", fmt.Errorf("%w: unclosed ${", errBadVariable)
			}
			name = p[next+1 : next+end]
			if !isVarName(name) {
				return "", fmt.Errorf("%w: ${%s}", errBadVariable, name)
			}
			next += end + 1
		} else {
			j := next
			for j < len(p) && isVarChar(p[j], j == next) {
				j++
			}
			if j == next { // "$" followed by no name: literal
				b.WriteByte('$')
				i++
				continue
			}
			name = p[next:j]
			next = j
		}
		v, ok := lookup(name)
		if !ok {
			return "", fmt.Errorf("%w $%s", errUnsetVar, name)
		}
		b.WriteString(v)
		i = next
	}
	return b.String(), nil
}

func isVarName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isVarChar(s[i], i == 0) {
			return false
		}
	}
	return true
}

func isVarChar(c byte, first bool) bool {
	switch {
	case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		return true
	case '0' <= c && c <= '9':
		return !first
	}
	return false
}
