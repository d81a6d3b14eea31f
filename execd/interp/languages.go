package interp

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/execd/process"
)

// driverFiles holds the drivers' sources: python.py, javascript.js (also
// the typescript driver), java.java and godriver/main.go.
//
//go:embed python.py javascript.js java.java godriver/main.go
var driverFiles embed.FS

// interruptMethod is how execd interrupts a language's running code.
type interruptMethod int

const (
	// bySignal sends SIGINT to the driver's process group.
	bySignal interruptMethod = iota
	// byPipe writes one byte to the driver's fd 5.
	byPipe
)

// language says how to run one language's driver.
type language struct {
	name string
	// interpreters are the program names looked up in PATH, in order.
	interpreters []string
	// driver is the file name of the driver's source in driverFiles;
	// target, when set, the name it is written under.
	driver string
	target string
	// args returns the interpreter's arguments after argv[0], given the
	// path of the driver file.
	args func(driver string) []string
	// prepare, when set, makes from the driver file what args is given
	// (a compiled form of it, kept beside it) and returns its path.
	prepare func(ctx context.Context, sup *process.Supervisor, interpreter, driver string, env []string) (string, error)
	// native says that prepare makes a program of its own: it is run
	// instead of the interpreter, and args is given the interpreter's path.
	native bool
	// env is added to the context's environment, overriding it.
	env       []string
	interrupt interruptMethod
	// startTimeout, when longer than DefaultStartTimeout, replaces it
	// (for a driver that is built before it starts).
	startTimeout time.Duration
}

// languages is every language a driver can exist for. Only those whose
// driver file is embedded are offered.
var languages = []language{
	{
		name:         "python",
		interpreters: []string{"python3", "python"},
		driver:       "python.py",
		// Imported rather than run as a script, so that python keeps its
		// compiled form in __pycache__ beside it: a context then starts
		// without compiling the driver (about 8 ms). The name is one no
		// user module has.
		target: "_osb_python_driver.py",
		// No -I, so PYTHONPATH and the user's site-packages work as in a
		// terminal; the driver takes its own directory off sys.path and
		// line-buffers stdout itself (no -u, no -P: they would cost
		// Python 3.8 to 3.10 support and one event per write).
		args: func(driver string) []string {
			dir, file := filepath.Split(driver)
			return []string{"-c", "import sys; sys.path.insert(0, " + strconv.Quote(dir) + "); import " + strings.TrimSuffix(file, ".py")}
		},
		env:       []string{"MPLBACKEND=agg"},
		interrupt: bySignal,
	},
	{
		name:         "javascript",
		interpreters: []string{"node", "nodejs"},
		driver:       "javascript.js",
		args:         func(driver string) []string { return []string{"--no-warnings", driver} },
		interrupt:    byPipe,
	},
	{
		// The javascript driver, which transpiles each cell with the
		// typescript module before it runs it.
		name:         "typescript",
		interpreters: []string{"node", "nodejs"},
		driver:       "javascript.js",
		args:         func(driver string) []string { return []string{"--no-warnings", driver, "typescript"} },
		interrupt:    byPipe,
	},
	{
		name:         "java",
		interpreters: []string{"java"},
		driver:       "java.java",
		// Named after its class: javac would take a file named java.java
		// on its source path for the package java.
		target: javaDriverClass + ".java",
		// Compiled once into a class directory beside the source (a
		// source program would be compiled again at every start, which
		// takes seconds). The serial collector suits one small process per
		// context; the standard streams are UTF-8 whatever the locale.
		prepare: compileJava,
		args: func(classes string) []string {
			return []string{"-XX:+UseSerialGC", "-Xshare:auto",
				"-Dfile.encoding=UTF-8", "-Dsun.stdout.encoding=UTF-8", "-Dsun.stderr.encoding=UTF-8",
				"--add-modules", "jdk.jshell", "-cp", classes, javaDriverClass}
		},
		interrupt: byPipe,
	},
	{
		// A driver written in Go, built once with the sandbox's go
		// command; it builds and runs a program for each run.
		name:         "go",
		interpreters: []string{"go"},
		driver:       "godriver/main.go",
		target:       "osb_go_driver.go",
		prepare:      buildGoDriver,
		native:       true,
		// Building the driver with a cold build cache takes seconds, and
		// many on a busy machine.
		startTimeout: 60 * time.Second,
		args:         func(gocmd string) []string { return []string{gocmd} },
		interrupt:    byPipe,
	},
}

// Languages returns the names of the languages offered, sorted.
func Languages() []string {
	var names []string
	for _, l := range languages {
		if l.available() {
			names = append(names, l.name)
		}
	}
	slices.Sort(names)
	return names
}

func lookupLanguage(name string) (*language, bool) {
	for i := range languages {
		if languages[i].name == name && languages[i].available() {
			return &languages[i], true
		}
	}
	return nil, false
}

func (l *language) available() bool {
	_, err := fs.Stat(driverFiles, l.driver)
	return err == nil
}

// ErrUnknownLanguage is returned by Start for a language not offered.
var ErrUnknownLanguage = errors.New("unknown language")

// NotInstalledError reports that no interpreter for a language is in PATH.
type NotInstalledError struct {
	// Interpreter is the first program name that was looked for.
	Interpreter string
}

func (e *NotInstalledError) Error() string {
	return e.Interpreter + " is not installed in this sandbox"
}

// findInterpreter returns the path of the first of l's interpreters found
// in path (a PATH value).
func (l *language) findInterpreter(path string) (string, error) {
	for _, name := range l.interpreters {
		for _, dir := range filepath.SplitList(path) {
			if dir == "" {
				dir = "."
			}
			p := filepath.Join(dir, name)
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", &NotInstalledError{Interpreter: l.interpreters[0]}
}

// written caches the driver files already written, by path.
var written sync.Map

// driverPath writes l's driver into dir (once per path, again if the file
// has gone) and returns its path. The file is 0600: only execd's user, the
// drivers' own, reads it.
func (l *language) driverPath(dir string) (string, error) {
	name := l.driver
	if l.target != "" {
		name = l.target
	}
	p := filepath.Join(dir, name)
	if _, ok := written.Load(p); ok {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	src, err := driverFiles.ReadFile(l.driver)
	if err != nil {
		return "", fmt.Errorf("read embedded %s driver: %w", l.name, err)
	}
	if old, err := os.ReadFile(p); err != nil || !bytes.Equal(old, src) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", fmt.Errorf("create driver directory: %w", err)
		}
		tmp, err := os.CreateTemp(dir, "."+filepath.Base(name)+"-*")
		if err != nil {
			return "", fmt.Errorf("write %s driver: %w", l.name, err)
		}
		_, err = tmp.Write(src)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), p)
		}
		if err != nil {
			os.Remove(tmp.Name())
			return "", fmt.Errorf("write %s driver: %w", l.name, err)
		}
	}
	written.Store(p, true)
	return p, nil
}

// environ returns env with l's own variables set, and PATH.
func (l *language) environ(env []string) (out []string, path string) {
	override := make(map[string]bool, len(l.env))
	for _, kv := range l.env {
		k, _, _ := strings.Cut(kv, "=")
		override[k] = true
	}
	path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "PATH" {
			path = v
		}
		if !override[k] {
			out = append(out, kv)
		}
	}
	return append(out, l.env...), path
}

// javaDriverClass is the main class of java.java.
const javaDriverClass = "OsbJavaDriver"

// javaCompile serializes the compilations of the java driver.
var javaCompile sync.Mutex

// compileJava compiles the java driver into the directory driver+".classes"
// unless its class there is as new as the source, and returns the
// directory. It runs the JDK's compiler through the java launcher, so that
// only java need be in PATH, as a child of sup (which may reap every child
// of execd). A new directory replaces the old one whole.
func compileJava(ctx context.Context, sup *process.Supervisor, interpreter, driver string, env []string) (string, error) {
	javaCompile.Lock()
	defer javaCompile.Unlock()
	classes := driver + ".classes"
	src, err := os.Stat(driver)
	if err != nil {
		return "", err
	}
	if cls, err := os.Stat(filepath.Join(classes, javaDriverClass+".class")); err == nil && !cls.ModTime().Before(src.ModTime()) {
		return classes, nil
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("compile the java driver (a JDK 17 or later is needed): %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(driver), ".java-classes-*")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmp)
	if err := runBuild(ctx, sup, process.Spec{
		Path: interpreter,
		Args: []string{interpreter, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
			"-m", "jdk.compiler/com.sun.tools.javac.Main", "-nowarn", "-implicit:none", "-d", tmp, driver},
		Dir: tmp,
		Env: env,
	}); err != nil {
		return fail(err)
	}
	os.RemoveAll(classes)
	if err := os.Rename(tmp, classes); err != nil {
		return fail(err)
	}
	return classes, nil
}

// goBuild serializes the builds of the go driver.
var goBuild sync.Mutex

// buildGoDriver builds the go driver into driver+".bin" unless that is as
// new as the source, and returns its path. The build cache is go's own
// (GOCACHE, or under the home directory), else a directory beside the
// driver that the contexts' builds share, as the driver does too;
// nothing is fetched and no C compiler is needed.
func buildGoDriver(ctx context.Context, sup *process.Supervisor, gocmd, driver string, env []string) (string, error) {
	goBuild.Lock()
	defer goBuild.Unlock()
	bin := driver + ".bin"
	src, err := os.Stat(driver)
	if err != nil {
		return "", err
	}
	if b, err := os.Stat(bin); err == nil && !b.ModTime().Before(src.ModTime()) {
		return bin, nil
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("build the go driver (go 1.19 or later is needed): %w", err)
	}
	dir := filepath.Dir(driver)
	// The environment's own values of these go, not only shadowed: a
	// program may read the first of two.
	set := []string{"GOTOOLCHAIN=local", "GOPROXY=off", "GOFLAGS=", "GOWORK=off", "CGO_ENABLED=0"}
	if !slices.ContainsFunc(env, func(kv string) bool {
		return strings.HasPrefix(kv, "GOCACHE=") || strings.HasPrefix(kv, "HOME=") || strings.HasPrefix(kv, "XDG_CACHE_HOME=")
	}) {
		set = append(set, "GOCACHE="+filepath.Join(dir, "go-build"))
	}
	buildEnv := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.ContainsFunc(set, func(s string) bool { return strings.HasPrefix(s, k+"=") })
	})
	buildEnv = append(buildEnv, set...)
	tmp := bin + ".tmp"
	defer os.Remove(tmp)
	if err := runBuild(ctx, sup, process.Spec{
		Path: gocmd,
		Args: []string{gocmd, "build", "-o", tmp, driver},
		Dir:  dir,
		Env:  buildEnv,
	}); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return fail(err)
	}
	return bin, nil
}

// runBuild runs a driver's build as a child of sup (which may reap every
// child of execd) and answers its output as the error when it fails.
func runBuild(ctx context.Context, sup *process.Supervisor, spec process.Spec) error {
	out, err := os.CreateTemp(spec.Dir, ".build-output-*")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	spec.Stdout, spec.Stderr = out, out
	proc, err := sup.Start(spec)
	if err != nil {
		return err
	}
	st, err := proc.Wait(ctx)
	if err != nil {
		proc.Signal(syscall.SIGKILL)
		return err
	}
	if st.Code != 0 {
		msg, _ := os.ReadFile(out.Name())
		return fmt.Errorf("%s: %s", st, bytes.TrimSpace(msg))
	}
	return nil
}
