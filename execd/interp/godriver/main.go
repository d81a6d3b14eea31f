// Command godriver is the driver of execd's go code contexts. execd embeds
// this file, builds it once with the sandbox's go toolchain (so it uses
// nothing newer than Go 1.19, Debian bookworm's golang-go) and runs one
// driver per context: fd 0 is /dev/null, fds 1 and 2 are the pipes execd
// streams as stdout and stderr, fd 3 carries requests (one JSON object per
// line), fd 4 carries replies (likewise) and fd 5 carries interrupts (one
// "\n" per request to interrupt the run in progress). Its only argument is
// the path of the go command.
//
// Semantics, as Go notebook kernels behave: each run builds and runs a new
// program. Its package-level declarations are those of every earlier run
// whose program built (imports, types, funcs and methods, consts, vars),
// a later declaration of a name replacing the earlier one, plus the
// current cell's; the cell's statements are the body of main. Statements
// of earlier runs do not run again, and values do not carry over from one
// run to the next: a package-level var is initialized anew in every run.
// Imports no code uses are left out of the program. A final expression
// that is not a call is shown as the run's result.
//
// Positions: the program carries //line directives, so that compile
// errors and panics name the line in the cell ("cell line 3:5: ..."), or
// the run of an earlier cell that declared it ("cell [2] line 1:6: ...").
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// A unit is one top-level declaration or statement of a cell.
type unit struct {
	src  string // its text
	cell int    // execution count of the run it came from
	line int    // position of its first character in that cell
	col  int
}

// A decl is a declaration that persists across runs.
type decl struct {
	unit
	names []string // keys: "v:x" for a type, const, var or func, "m:T.f" for a method
}

// An imp is one import spec that persists across runs.
type imp struct {
	unit
	name string // the local name ("" for the package's own, "_" or ".")
	path string
}

type state struct {
	imports []imp
	decls   []decl
}

type reply map[string]any

var (
	replyMu sync.Mutex
	replies *os.File
)

func send(r reply) {
	b, err := json.Marshal(r)
	if err != nil {
		b, _ = json.Marshal(reply{"type": "error", "id": r["id"], "ename": "DriverError", "evalue": err.Error()})
	}
	replyMu.Lock()
	defer replyMu.Unlock()
	replies.Write(append(b, '\n'))
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: godriver GO")
		os.Exit(2)
	}
	gocmd := os.Args[1]
	// The programs the driver starts get none of its pipes.
	for fd := 3; fd <= 5; fd++ {
		syscall.CloseOnExec(fd)
	}
	requests := os.NewFile(3, "requests")
	replies = os.NewFile(4, "replies")
	work, err := os.MkdirTemp("", "osb-go-context-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "execd go driver:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(work)
	env := buildEnv()
	ir := newInterrupter()

	send(reply{"type": "ready", "language": "go", "version": strings.TrimPrefix(runtime.Version(), "go")})
	var st state
	count := 0
	in := bufio.NewReader(requests)
	for {
		line, err := in.ReadBytes('\n')
		if len(line) > 0 {
			var req struct{ Type, ID, Code string }
			if json.Unmarshal(line, &req) == nil && req.Type == "execute" && req.ID != "" {
				count++
				run := &run{gocmd: gocmd, env: env, work: work, id: req.ID, count: count, ir: ir}
				st = run.execute(st, req.Code)
				send(reply{"type": "done", "id": req.ID})
			}
		}
		if err != nil {
			return
		}
	}
}

// buildEnv is the environment of go build: no network, no other
// toolchain, no cgo (no C compiler is needed), and go's own build cache,
// or one beside the driver's binary, shared by the contexts, where go has
// no home directory for it.
func buildEnv() []string {
	env := os.Environ()
	set := func(k, v string) {
		for i, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				env[i] = k + "=" + v
				return
			}
		}
		env = append(env, k+"="+v)
	}
	if _, err := os.UserCacheDir(); err != nil && os.Getenv("GOCACHE") == "" {
		exe, err := os.Executable()
		if err == nil {
			set("GOCACHE", filepath.Join(filepath.Dir(exe), "go-build"))
		}
	}
	set("GOTOOLCHAIN", "local")
	set("GOPROXY", "off")
	set("GOFLAGS", "")
	set("GOWORK", "off")
	set("CGO_ENABLED", "0")
	return env
}

// interrupter turns the "\n"s read from fd 5 into kills of the program of
// the run in progress. When a run starts the driver writes a mark
// ("S<run>.") into the same pipe: a "\n" read before the mark of the run
// in progress was meant for an earlier run and is ignored.
type interrupter struct {
	mu      sync.Mutex
	run     int // the run whose mark was read last
	current int // the run in progress, 0 between runs
	proc    *os.Process
	group   bool // proc leads a process group of its own
	hit     bool
	marks   *os.File
}

func newInterrupter() *interrupter {
	ir := &interrupter{}
	f, err := os.OpenFile("/proc/self/fd/5", os.O_WRONLY, 0)
	if err == nil {
		syscall.CloseOnExec(int(f.Fd()))
		ir.marks = f
	}
	go ir.read()
	return ir
}

func (ir *interrupter) read() {
	in := bufio.NewReader(os.NewFile(5, "interrupts"))
	for {
		b, err := in.ReadByte()
		if err != nil {
			return
		}
		switch b {
		case 'S':
			s, err := in.ReadString('.')
			if err != nil {
				return
			}
			n, _ := strconv.Atoi(strings.TrimSuffix(s, "."))
			ir.mu.Lock()
			ir.run = n
			ir.mu.Unlock()
		case '\n':
			ir.mu.Lock()
			if ir.current != 0 && (ir.marks == nil || ir.run == ir.current) {
				ir.hit = true
				ir.kill()
			}
			ir.mu.Unlock()
		}
	}
}

// kill kills the run's build or program: the build's whole process
// group (the compiler it runs too), the program alone (it is in the
// driver's group, which execd kills with the context). ir.mu is held.
func (ir *interrupter) kill() {
	if ir.proc == nil {
		return
	}
	if ir.group {
		syscall.Kill(-ir.proc.Pid, syscall.SIGKILL)
	} else {
		ir.proc.Kill()
	}
}

// begin marks the start of run n.
func (ir *interrupter) begin(n int) {
	ir.mu.Lock()
	ir.current, ir.hit, ir.proc = n, false, nil
	ir.mu.Unlock()
	if ir.marks != nil {
		fmt.Fprintf(ir.marks, "S%d.", n)
	}
}

// end marks the end of the run in progress.
func (ir *interrupter) end() {
	ir.mu.Lock()
	ir.current, ir.proc = 0, nil
	ir.mu.Unlock()
}

// start starts cmd unless the run was interrupted; an interrupt then kills it.
func (ir *interrupter) start(cmd *exec.Cmd) error {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	if ir.hit {
		return errInterrupted
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	ir.proc = cmd.Process
	ir.group = cmd.SysProcAttr != nil && cmd.SysProcAttr.Setpgid
	return nil
}

func (ir *interrupter) interrupted() bool {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	return ir.hit
}

var errInterrupted = errors.New("interrupted")

// maxResult bounds the text of a result; the rest is left out, with a
// note.
const maxResult = 1 << 20

type run struct {
	gocmd string
	env   []string
	work  string
	id    string
	count int
	ir    *interrupter
}

func (r *run) fail(ename, evalue string, tb []string) {
	if tb == nil {
		tb = []string{}
	}
	send(reply{"type": "error", "id": r.id, "ename": ename, "evalue": evalue, "traceback": tb})
}

// execute runs one cell and returns the state after it: st with the
// cell's declarations if the program built, st itself if it did not.
func (r *run) execute(st state, code string) state {
	r.ir.begin(r.count)
	defer r.ir.end()
	send(reply{"type": "started", "id": r.id})

	units, err := split(code, r.count)
	if err != nil {
		r.compileError(err, code)
		return st
	}
	next, body, show, err := st.add(units, r.count)
	if err != nil {
		r.compileError(err, code)
		return st
	}
	src, err := next.program(body, show)
	if err != nil {
		r.compileError(err, code)
		return st
	}
	dir := filepath.Join(r.work, "run")
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		r.fail("DriverError", err.Error(), nil)
		return st
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), src, 0o600); err != nil {
		r.fail("DriverError", err.Error(), nil)
		return st
	}
	// A file, not a buffer: Wait then does not wait for the compiler an
	// interrupted go command leaves running.
	out, err := os.Create(filepath.Join(dir, "build-output"))
	if err != nil {
		r.fail("DriverError", err.Error(), nil)
		return st
	}
	defer out.Close()
	build := exec.Command(r.gocmd, "build", "-o", "prog", "main.go")
	build.Dir, build.Env, build.Stdout, build.Stderr = dir, r.env, out, out
	build.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.wait(build); err != nil {
		if r.ir.interrupted() {
			r.fail("Interrupted", "execution was interrupted", []string{"Interrupted: execution was interrupted"})
			return st
		}
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			r.fail("DriverError", "go build: "+err.Error(), nil)
			return st
		}
		text, _ := os.ReadFile(out.Name())
		msgs := buildErrors(string(text), r.count)
		evalue := "go build failed"
		if len(msgs) > 0 {
			evalue = msgs[0]
			if i := strings.Index(evalue, ": "); i >= 0 && strings.HasPrefix(evalue, "cell") {
				evalue = evalue[i+2:]
			}
		}
		r.fail("CompileError", evalue, msgs)
		return st
	}

	// The program writes its result or its panic to fd 3.
	res, err := os.Create(filepath.Join(dir, "result"))
	if err != nil {
		r.fail("DriverError", err.Error(), nil)
		return st
	}
	defer res.Close()
	prog := exec.Command(filepath.Join(dir, "prog"))
	prog.Stdout, prog.Stderr, prog.ExtraFiles = os.Stdout, os.Stderr, []*os.File{res}
	err = r.wait(prog)
	result, _ := os.ReadFile(res.Name())
	var msg struct {
		Result *string
		Panic  *string
		Stack  string
	}
	json.Unmarshal(result, &msg)
	switch {
	case r.ir.interrupted():
		r.fail("Interrupted", "execution was interrupted", []string{"Interrupted: execution was interrupted"})
	case msg.Panic != nil:
		tb := append([]string{"panic: " + *msg.Panic}, userFrames(msg.Stack, r.count)...)
		r.fail("panic", *msg.Panic, tb)
	case err != nil:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			r.fail("ExitError", exit.ProcessState.String(), []string{"the program ended: " + exit.ProcessState.String()})
		} else {
			r.fail("DriverError", err.Error(), nil)
		}
	case msg.Result != nil:
		if len(*msg.Result) > maxResult {
			cut := (*msg.Result)[:maxResult] + fmt.Sprintf("\n[... %d more bytes of the result left out]", len(*msg.Result)-maxResult)
			msg.Result = &cut
		}
		send(reply{"type": "result", "id": r.id, "execution_count": r.count, "data": map[string]any{"text/plain": *msg.Result}})
	}
	// The cell compiled: its declarations are kept, whatever its
	// statements did.
	return next
}

func (r *run) wait(cmd *exec.Cmd) error {
	if err := r.ir.start(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// compileError reports the syntax errors of the program made of code.
// Those past the cell's text (the code ends in the middle of a statement)
// are reported once, at the cell's last line.
func (r *run) compileError(err error, code string) {
	var list scanner.ErrorList
	if errors.As(err, &list) && len(list) > 0 {
		var tb []string
		for _, e := range list {
			if !strings.HasPrefix(e.Pos.Filename, "cell") {
				tb = append(tb, fmt.Sprintf("cell line %d: the cell ends in the middle of a statement (%s)", strings.Count(strings.TrimRight(code, "\n"), "\n")+1, e.Msg))
				break
			}
			tb = append(tb, fmt.Sprintf("%s: %s", cellPos(e.Pos.Filename, e.Pos.Line, e.Pos.Column, r.count), e.Msg))
		}
		evalue := tb[0][strings.Index(tb[0], ": ")+2:]
		r.fail("CompileError", evalue, tb)
		return
	}
	r.fail("CompileError", err.Error(), []string{err.Error()})
}

// cellName is the file name of cell n in the program's //line directives.
func cellName(n int) string { return "cell" + strconv.Itoa(n) }

// cellPos names a position: "cell line 3:5" in the current cell, "cell
// [2] line 3:5" in the cell of run 2.
func cellPos(file string, line, col, current int) string {
	n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(file), "cell"))
	pos := strconv.Itoa(line)
	if col > 0 {
		pos += ":" + strconv.Itoa(col)
	}
	switch {
	case err != nil || !strings.HasPrefix(filepath.Base(file), "cell"):
		return file + ":" + pos
	case n == current:
		return "cell line " + pos
	default:
		return "cell [" + strconv.Itoa(n) + "] line " + pos
	}
}

var buildPos = regexp.MustCompile(`^(?:\./)?(cell\d+):(\d+)(?::(\d+))?: (.*)$`)

// buildErrors returns go build's messages with their positions in the
// cells, in the cells' order (the compiler reports unused variables after
// the other errors), without the package header.
func buildErrors(out string, current int) []string {
	type msg struct {
		pos  [3]int // cell, line, column
		text string
	}
	var msgs []msg
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.HasPrefix(l, "# ") || l == "" {
			continue
		}
		m := msg{pos: [3]int{math.MaxInt}, text: l}
		if sub := buildPos.FindStringSubmatch(l); sub != nil {
			cell, _ := strconv.Atoi(strings.TrimPrefix(sub[1], "cell"))
			line, _ := strconv.Atoi(sub[2])
			col, _ := strconv.Atoi(sub[3])
			m = msg{pos: [3]int{cell, line, col}, text: cellPos(sub[1], line, col, current) + ": " + sub[4]}
		}
		msgs = append(msgs, m)
	}
	sort.SliceStable(msgs, func(i, j int) bool {
		a, b := msgs[i].pos, msgs[j].pos
		for k := range a {
			if a[k] != b[k] {
				return a[k] < b[k]
			}
		}
		return false
	})
	texts := make([]string, len(msgs))
	for i, m := range msgs {
		texts[i] = m.text
	}
	return texts
}

// userFrames keeps the frames of a goroutine trace that are in the cells:
// "f() at cell line 3".
func userFrames(stack string, current int) []string {
	lines := strings.Split(stack, "\n")
	var out []string
	for i := 1; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		file, rest, ok := strings.Cut(l, ":")
		if !ok || !strings.HasPrefix(file, "cell") {
			continue
		}
		num, _, _ := strings.Cut(rest, " ")
		line, err := strconv.Atoi(num)
		if err != nil {
			continue
		}
		fn := strings.TrimSpace(lines[i-1])
		if j := strings.LastIndex(fn, "("); j > 0 {
			fn = fn[:j] + "()"
		}
		fn = strings.TrimPrefix(fn, "main.")
		if fn == "_osbMain()" {
			fn = "main()"
		}
		out = append(out, "\tat "+fn+" ("+cellPos(file, line, 0, current)+")")
	}
	return out
}

// split cuts a cell into its top-level units: the tokens between two
// semicolons (written or inserted at a line's end) outside brackets.
func split(code string, cell int) ([]unit, error) {
	fset := token.NewFileSet()
	file := fset.AddFile(cellName(cell), -1, len(code))
	var errs scanner.ErrorList
	var s scanner.Scanner
	s.Init(file, []byte(code), func(pos token.Position, msg string) { errs.Add(pos, msg) }, 0)
	var units []unit
	// start is the offset of the unit's first token, end that just past
	// its last (a comment after it is not part of it). header: in the
	// clauses of a for, if or switch, up to its block, whose semicolons
	// do not end the statement.
	depth, start, end, header := 0, -1, 0, false
	flush := func() {
		if start >= 0 {
			p := fset.Position(file.Pos(start))
			units = append(units, unit{src: code[start:end], cell: cell, line: p.Line, col: p.Column})
		}
		start = -1
	}
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			flush()
			break
		}
		off := file.Offset(pos)
		switch tok {
		case token.FOR, token.IF, token.SWITCH:
			header = header || depth == 0
		case token.LBRACE:
			header = header && depth != 0
			depth++
		case token.LPAREN, token.LBRACK:
			depth++
		case token.RPAREN, token.RBRACK, token.RBRACE:
			depth--
		}
		if tok == token.SEMICOLON && depth == 0 && !(header && lit == ";") {
			if lit == ";" {
				end = off + 1
			}
			flush()
			continue
		}
		if start < 0 {
			start = off
		}
		if lit == "" {
			lit = tok.String()
		}
		end = off + len(lit)
	}
	if len(errs) > 0 {
		errs.Sort()
		return nil, errs
	}
	if depth != 0 {
		return nil, errors.New("unbalanced brackets in the cell")
	}
	return units, nil
}

// directive is the //line directive that makes the text after it start at
// u's position.
func (u unit) directive() string {
	return fmt.Sprintf("\n//line %s:%d:%d\n", cellName(u.cell), u.line, u.col)
}

// add returns st with the declarations among units added, the other
// units (the statements of main), and the expression to show, if the
// last unit is one that is not a call.
func (st state) add(units []unit, cell int) (next state, body []unit, show *unit, err error) {
	next = state{imports: append([]imp(nil), st.imports...), decls: append([]decl(nil), st.decls...)}
	for i, u := range units {
		f, perr := parser.ParseFile(token.NewFileSet(), cellName(cell), "package main;"+u.directive()+u.src, parser.SkipObjectResolution)
		if perr != nil || len(f.Decls) != 1 {
			if i == len(units)-1 {
				if e, ok := parseExpr(u); ok {
					if _, call := e.(*ast.CallExpr); !call {
						if _, recv := e.(*ast.UnaryExpr); !recv || e.(*ast.UnaryExpr).Op != token.ARROW {
							show = &units[i]
							continue
						}
					}
				}
			}
			body = append(body, u)
			continue
		}
		if len(f.Imports) > 0 {
			for _, s := range f.Imports {
				path, _ := strconv.Unquote(s.Path.Value)
				name := ""
				if s.Name != nil {
					name = s.Name.Name
				}
				next.imports = replaceImport(next.imports, imp{unit: u, name: name, path: path})
			}
			continue
		}
		d := decl{unit: u}
		switch x := f.Decls[0].(type) {
		case *ast.FuncDecl:
			if x.Recv == nil && x.Name.Name == "main" {
				// The cell's own main: it runs in this run only.
				i := strings.Index(u.src, "main")
				body = append(body, unit{src: "_osbMain := func" + u.src[i+len("main"):] + "\n_osbMain()", cell: u.cell, line: u.line, col: u.col})
				continue
			}
			if x.Recv == nil {
				if x.Name.Name == "init" {
					d.names = []string{"init:" + strconv.Itoa(len(next.decls)) + ":" + strconv.Itoa(cell)}
				} else {
					d.names = []string{"v:" + x.Name.Name}
				}
			} else if len(x.Recv.List) == 1 {
				d.names = []string{"m:" + recvType(x.Recv.List[0].Type) + "." + x.Name.Name}
			}
		case *ast.GenDecl:
			for _, s := range x.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					d.names = append(d.names, "v:"+s.Name.Name)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.Name != "_" {
							d.names = append(d.names, "v:"+n.Name)
						}
					}
				}
			}
		}
		next.decls = replaceDecl(next.decls, d)
	}
	return next, body, show, nil
}

func parseExpr(u unit) (ast.Expr, bool) {
	if strings.HasSuffix(strings.TrimSpace(u.src), ";") {
		return nil, false
	}
	e, err := parser.ParseExpr(u.src)
	return e, err == nil
}

func recvType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// replaceDecl adds d, first dropping the earlier declarations of any of
// its names (and of a type's methods when the type is declared anew).
func replaceDecl(decls []decl, d decl) []decl {
	names := map[string]bool{}
	for _, n := range d.names {
		names[n] = true
	}
	var out []decl
	for _, old := range decls {
		keep := true
		for _, n := range old.names {
			if names[n] {
				keep = false
			}
		}
		if keep {
			out = append(out, old)
		}
	}
	return append(out, d)
}

// localName is the name an import is known by in the code.
func (i imp) localName() string {
	if i.name != "" {
		return i.name
	}
	parts := strings.Split(i.path, "/")
	last := parts[len(parts)-1]
	if len(parts) > 1 && regexp.MustCompile(`^v[0-9]+$`).MatchString(last) {
		last = parts[len(parts)-2]
	}
	if j := strings.IndexAny(last, ".-"); j > 0 {
		last = last[:j]
	}
	return last
}

func replaceImport(imports []imp, i imp) []imp {
	var out []imp
	for _, old := range imports {
		same := old.path == i.path && old.name == i.name
		if !same && (i.localName() == "_" || i.localName() == "." || old.localName() != i.localName()) {
			out = append(out, old)
		}
	}
	return append(out, i)
}

// program writes the run's main.go: the imports the code uses, the
// declarations, and main with the cell's statements.
func (st state) program(body []unit, show *unit) ([]byte, error) {
	var rest bytes.Buffer
	for _, d := range st.decls {
		rest.WriteString(d.directive() + d.src + "\n")
	}
	rest.WriteString("\n//line osb.go:1:1\nfunc main() {\n\tdefer _osbRecover()\n")
	for _, u := range body {
		rest.WriteString(u.directive() + u.src + "\n")
	}
	if show != nil {
		rest.WriteString("\n//line osb.go:1:1\n_osbShow(\n" + show.directive() + show.src + ",\n//line osb.go:1:1\n)\n")
	}
	rest.WriteString("\n//line osb.go:1:1\n}\n" + runtimeHelpers)

	// Which imports the code uses: the package names it selects from
	// that no declaration in scope hides.
	f, err := parser.ParseFile(token.NewFileSet(), "", "package main\n"+rest.String(), 0)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil {
				used[id.Name] = true
			}
		}
		return true
	})
	var out bytes.Buffer
	out.WriteString("package main\n\nimport (\n\t_osbjson \"encoding/json\"\n\t_osbfmt \"fmt\"\n\t_osbos \"os\"\n\t_osbdebug \"runtime/debug\"\n")
	for _, i := range st.imports {
		if n := i.localName(); n == "_" || n == "." || used[n] {
			name := i.name
			if name != "" {
				name += " "
			}
			out.WriteString(i.directive() + name + strconv.Quote(i.path) + "\n")
		}
	}
	out.WriteString("\n//line osb.go:1:1\n)\n")
	out.Write(rest.Bytes())
	return out.Bytes(), nil
}

// runtimeHelpers report the run's result and a panic of main's goroutine
// to the driver on fd 3.
const runtimeHelpers = `
//line osb.go:1:1
func _osbReport(v any) {
	b, _ := _osbjson.Marshal(v)
	_osbos.NewFile(3, "result").Write(b)
}

func _osbShow(v any) { _osbReport(map[string]any{"Result": _osbfmt.Sprint(v)}) }

func _osbRecover() {
	if r := recover(); r != nil {
		_osbReport(map[string]any{"Panic": _osbfmt.Sprint(r), "Stack": string(_osbdebug.Stack())})
		_osbos.Exit(2)
	}
}
`
