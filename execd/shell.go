package execd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// defaultPath is searched when a process's environment has no PATH.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// lookPath finds an executable the way a shell would, in the PATH of the
// environment env (not execd's own).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		if err := checkExecutable(name); err != nil {
			return "", err
		}
		return name, nil
	}
	path := lookupEnv(env, "PATH")
	if path == "" {
		path = defaultPath
	}
	for _, dir := range filepath.SplitList(path) {
		// Relative entries would depend on the working directory of
		// whoever asks; a shell started by execd never searches them.
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: executable file not found in $PATH", name)
}

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return &os.PathError{Op: "exec", Path: p, Err: syscall.EACCES}
	}
	return nil
}

// commandLine turns a command string into the argv that runs it: bash -c,
// else sh -c, else, in an image without any shell, the command's own words
// executed directly. The last form takes plain invocations only
// ("python3 -m http.server 8080", quotes and backslashes allowed) and
// rejects shell syntax, which nothing could interpret.
func commandLine(command string, env []string) (path string, argv []string, err error) {
	if p, posix, err := findShell(env); err == nil {
		name := "bash"
		if posix {
			name = "sh"
		}
		return p, []string{name, "-c", command}, nil
	}
	words, err := splitWords(command)
	if err != nil {
		return "", nil, fmt.Errorf("%w, and the command needs one: %v", errNoShell, err)
	}
	if len(words) == 0 {
		return "", nil, errors.New("empty command")
	}
	p, err := lookPath(words[0], env)
	if err != nil {
		return "", nil, fmt.Errorf("%w to run the command; direct execution: %v", errNoShell, err)
	}
	return p, words, nil
}

var errNoShell = errors.New("no shell (bash or sh) in this image")

// findShell finds the shell that commands, sessions and terminals use in
// the PATH of env: bash, else a plain POSIX sh (posix set), else
// errNoShell.
func findShell(env []string) (path string, posix bool, err error) {
	if path, err = lookPath("bash", env); err == nil {
		return path, false, nil
	}
	if path, err = lookPath("sh", env); err == nil {
		return path, true, nil
	}
	return "", false, errNoShell
}

// lookupEnv returns the value of name in env, the last one if it is set
// more than once, as execve's consumers read it.
func lookupEnv(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
			return v
		}
	}
	return ""
}

// splitWords splits a command into words as a shell would for a simple
// command: blanks separate words, single quotes keep everything, double
// quotes keep everything but backslash escapes of $ ` " \ and newline, and
// a backslash outside quotes escapes the next character. Any character that
// a shell would interpret (| & ; < > ( ) $ ` * ? [ ] # ~ at a word start,
// or an unquoted newline) is an error, because executing it literally
// would not do what the user meant.
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, errors.New("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				switch s[i] {
				case '\\':
					if i+1 < len(s) && strings.IndexByte("$`\"\\\n", s[i+1]) >= 0 {
						i++
					}
				case '$', '`':
					return nil, fmt.Errorf("%q inside double quotes needs a shell", s[i])
				}
				cur.WriteByte(s[i])
			}
			if i == len(s) {
				return nil, errors.New("unterminated double quote")
			}
			inWord = true
		case c == '\\':
			if i+1 == len(s) {
				return nil, errors.New("trailing backslash")
			}
			i++
			cur.WriteByte(s[i])
			inWord = true
		case strings.IndexByte("|&;<>()$`*?[]\n", c) >= 0, (c == '#' || c == '~') && !inWord:
			return nil, fmt.Errorf("%q needs a shell", c)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
