// Command codebench measures execd's code interpreter (the /code routes)
// inside a real container of the code-interpreter image, against what a
// user does without one on the same container, in one run, and prints a
// table with the ratio of each row.
//
//	go run ./bench/codebench [-mode full|quick] [-out bench/results] [-languages java,typescript]
//
// It drives execd over raw HTTP with the event decoder the SDK uses, so
// the figures are execd's alone. It needs a running Docker engine and the
// local image opensandbox/code-interpreter (make images). A language whose
// driver this execd build does not embed is reported as not offered, not
// as a failure.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
)

const (
	execdPath = "/opt/opensandbox/bin/execd"
	image     = "opensandbox/code-interpreter"
	// label marks this harness's containers, so that those of a run that
	// was killed are removed by the next.
	label = "osb-codebench=1"
	// target is the warm round trip's goal for p50, in milliseconds.
	target = 10.0
)

// settings are the run counts of one mode.
type settings struct {
	warmUps     int // untimed warm-context runs before the timed ones
	warmRuns    int // timed warm-context runs of `1+1`, per language
	creations   int // timed context creations, per language
	dockerExecs int // timed `docker exec` one-shot runs, per language
	commands    int // timed one-shot runs through POST /command, per language
	plots       int // timed matplotlib plots
}

var modes = map[string]settings{
	"full":  {warmUps: 20, warmRuns: 500, creations: 30, dockerExecs: 40, commands: 100, plots: 40},
	"quick": {warmUps: 20, warmRuns: 100, creations: 10, dockerExecs: 15, commands: 30, plots: 15},
}

// language is one interpreter under test, with its stateless one-shot
// equivalent.
type language struct {
	name string
	// oneShot runs `1+1` with a fresh interpreter and prints "2"; command
	// is the same as a shell command.
	oneShot []string
	command string
	// slow: every run builds a program (go), so each count of the mode
	// is divided by 10, and the warm round trip has no target.
	slow bool
}

var languages = []language{
	{name: "python", oneShot: []string{"python3", "-c", "print(1+1)"}, command: "python3 -c 'print(1+1)'"},
	{name: "javascript", oneShot: []string{"node", "-e", "console.log(1+1)"}, command: "node -e 'console.log(1+1)'"},
	// Debian's typescript module, transpiling the cell as the driver does.
	{name: "typescript", oneShot: []string{"node", "-e", tsOneShot}, command: "node -e \"" + tsOneShot + "\""},
	// A single-file source program: what java offers without JShell's
	// state.
	{name: "java", oneShot: []string{"sh", "-c", javaOneShot}, command: javaOneShot},
	// go run of the same program as a cell builds.
	{name: "go", oneShot: []string{"sh", "-c", goOneShot}, command: goOneShot, slow: true},
}

const (
	tsOneShot   = "console.log(eval(require('/usr/share/nodejs/typescript').transpile('1+1')))"
	goOneShot   = "printf 'package main\\nimport \"fmt\"\\nfunc main() { fmt.Println(1+1) }\\n' >/tmp/codebench-a.go && go run /tmp/codebench-a.go"
	javaOneShot = "echo 'class A { public static void main(String[] a) { System.out.println(1+1); } }' >/tmp/codebench-A.java && java /tmp/codebench-A.java"
)

// plotCode draws and shows a figure; the driver sends it as image/png.
const plotCode = "import matplotlib.pyplot as plt; plt.plot([1,2,3]); plt.show()"

// row is one line of the results table.
type row = report.Row

func main() {
	mode := flag.String("mode", "full", "full or quick")
	out := flag.String("out", "bench/results", "directory for the JSON results and the PNG chart")
	only := flag.String("languages", "", "measure only these languages, comma-separated (default: all)")
	flag.Parse()
	if *only != "" {
		var keep []language
		for _, l := range languages {
			if slices.Contains(strings.Split(*only, ","), l.name) {
				keep = append(keep, l)
			}
		}
		languages = keep
	}
	set := benchkit.Mode("codebench", *mode, modes)
	removeContainers()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	var interrupted atomic.Bool
	go func() {
		<-sig
		interrupted.Store(true)
		fmt.Fprintln(os.Stderr, "codebench: interrupted, removing the containers")
		removeContainers()
		os.Exit(130)
	}()
	start := time.Now()
	rows, err := runAll(set)
	if interrupted.Load() {
		select {} // the signal's goroutine cleans up and exits
	}
	removeContainers()
	rep := report.Report{Benchmark: "code", Subject: "execd /code", Mode: *mode,
		RatioNote:   "how many times faster execd's code interpreter is than the baseline (baseline time / execd time)",
		RatioFormat: "%.1fx", Rows: rows}
	rep.Print(os.Stdout)
	fmt.Printf("run time %.0f s\n", time.Since(start).Seconds())
	if err != nil {
		fmt.Fprintln(os.Stderr, "codebench:", err)
		os.Exit(1)
	}
	if err := rep.Write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "codebench:", err)
		os.Exit(1)
	}
}

// removeContainers removes every container this harness started, in this
// run or in one that was killed.
func removeContainers() {
	out, err := exec.Command("docker", "ps", "-aq", "--filter", "label="+label).Output()
	if err != nil {
		return
	}
	if ids := strings.Fields(string(out)); len(ids) > 0 {
		exec.Command("docker", append([]string{"rm", "-f"}, ids...)...).Run()
	}
}

// bench holds the container under test and a client for its execd.
type bench struct {
	set   settings
	cid   string
	base  string
	token string
	hc    *http.Client
}

// runAll builds execd, starts the container and measures every language;
// the rows measured before an error are returned with it.
func runAll(set settings) (rows []row, err error) {
	tmp, err := os.MkdirTemp("", "codebench-")
	if err != nil {
		return nil, fmt.Errorf("make a temporary directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "execd")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/execd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build execd: %v\n%s", err, out)
	}
	var tok [16]byte
	rand.Read(tok[:])
	b := &bench{set: set, token: hex.EncodeToString(tok[:]), hc: &http.Client{}}
	out, err := dockerOut("run", "-d", "--label", label, "-p", fmt.Sprintf("127.0.0.1::%d", api.ExecdPort),
		"-v", bin+":"+execdPath+":ro", "--entrypoint", execdPath, image,
		"--access-token", b.token, "--", "sleep", "infinity")
	if err != nil {
		return nil, err
	}
	b.cid = strings.TrimSpace(out)
	port, err := dockerOut("port", b.cid, fmt.Sprintf("%d/tcp", api.ExecdPort))
	if err != nil {
		return nil, err
	}
	b.base = "http://" + strings.TrimSpace(strings.Split(port, "\n")[0])
	if err := b.waitReady(); err != nil {
		return nil, err
	}

	for _, lang := range languages {
		lrows, err := b.language(lang)
		rows = append(rows, lrows...)
		if err != nil {
			return rows, fmt.Errorf("%s: %w", lang.name, err)
		}
	}
	return rows, nil
}

// language measures one language: warm round trips, context creation and
// their baselines, and for python a matplotlib plot.
func (b *bench) language(lang language) ([]row, error) {
	warm, err := b.createContext(lang.name)
	var refused *notOffered
	if errors.As(err, &refused) {
		fmt.Fprintf(os.Stderr, "  %s: not offered by this execd build (%v)\n", lang.name, refused)
		note := "not offered by this execd build (POST /code/context: " + refused.Error() + ")"
		return []row{
			{Name: lang.name + " `1+1`, warm context, p50 (p99)", Unit: "ms", Target: fmt.Sprintf("p50 < %g ms: -", target), Note: note},
			{Name: lang.name + " context creation, p50 (p99)", Unit: "ms", Note: note},
		}, nil
	}
	if err != nil {
		return nil, err
	}
	defer b.deleteContext(warm)
	set := b.set
	if lang.slow {
		for _, n := range []*int{&set.warmUps, &set.warmRuns, &set.creations, &set.dockerExecs, &set.commands} {
			*n = max(3, *n/10)
		}
	}

	for range set.warmUps {
		if err := b.runSum(warm, lang.name); err != nil {
			return nil, err
		}
	}
	var ours []time.Duration
	for range set.warmRuns {
		start := time.Now()
		if err := b.runSum(warm, lang.name); err != nil {
			return nil, err
		}
		ours = append(ours, time.Since(start))
	}
	progress(lang.name+" warm `1+1`", ours)

	var dockerRuns []time.Duration
	for range set.dockerExecs {
		start := time.Now()
		out, err := dockerOut(append([]string{"exec", b.cid}, lang.oneShot...)...)
		if err != nil {
			return nil, err
		}
		dockerRuns = append(dockerRuns, time.Since(start))
		if strings.TrimSpace(out) != "2" {
			return nil, fmt.Errorf("docker exec %s printed %q, want 2", strings.Join(lang.oneShot, " "), out)
		}
	}
	progress(lang.name+" docker exec", dockerRuns)

	cmd := lang.command
	var commandRuns []time.Duration
	for range set.commands {
		start := time.Now()
		if err := b.command(cmd, "2"); err != nil {
			return nil, err
		}
		commandRuns = append(commandRuns, time.Since(start))
	}
	progress(lang.name+" /command", commandRuns)

	var creations []time.Duration
	for range set.creations {
		start := time.Now()
		id, err := b.createContext(lang.name)
		if err != nil {
			return nil, err
		}
		creations = append(creations, time.Since(start))
		if err := b.deleteContext(id); err != nil {
			return nil, err
		}
	}
	progress(lang.name+" context creation", creations)

	p50 := report.Percentile(ours, 0.5)
	verdict := "PASS"
	if p50 >= target {
		verdict = "MISS"
	}
	targetText := fmt.Sprintf("p50 < %g ms: %s", target, verdict)
	if lang.slow {
		targetText = "-"
	}
	rows := []row{
		timeRow(lang.name+" `1+1`, warm context, p50 (p99)", ours, dockerRuns, "docker exec "+lang.oneShot[0],
			targetText,
			fmt.Sprintf("mean %.2f ms over %d runs after %d warm-ups; baseline %d runs", report.Mean(ours), len(ours), set.warmUps, len(dockerRuns))),
		timeRow(lang.name+" `1+1`, warm context vs a fresh interpreter", ours, commandRuns, "/command "+lang.oneShot[0],
			"", fmt.Sprintf("baseline: `%s` through POST /command, %d runs", cmd, len(commandRuns))),
		timeRow(lang.name+" context creation, p50 (p99)", creations, commandRuns, "/command "+lang.oneShot[0],
			"", fmt.Sprintf("%d contexts, each deleted after; mean %.1f ms", len(creations), report.Mean(creations))),
	}
	if lang.name == "python" {
		r, err := b.plots(warm)
		if err != nil {
			return rows, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// plots times a matplotlib plot shown in a warm context, from the request
// to its PNG, after matplotlib was imported and a first figure drawn.
func (b *bench) plots(id string) (row, error) {
	if _, err := b.run(id, "python", "import matplotlib.pyplot as plt"); err != nil {
		return row{}, err
	}
	var size int
	var runs []time.Duration
	for i := range 3 + b.set.plots {
		start := time.Now()
		evs, err := b.run(id, "python", plotCode)
		if err != nil {
			return row{}, err
		}
		d := time.Since(start)
		if size, err = pngSize(evs); err != nil {
			return row{}, err
		}
		if i >= 3 {
			runs = append(runs, d)
		}
	}
	progress("python matplotlib PNG", runs)
	inside, insideP99, err := b.plotsInside(id)
	if err != nil {
		return row{}, err
	}
	fmt.Fprintf(os.Stderr, "  python matplotlib PNG timed inside the interpreter: p50 %.2f ms, p99 %.2f ms\n", inside, insideP99)
	r := row{Name: "python matplotlib plot to PNG, warm context, p50 (p99)", Unit: "ms",
		Value: report.Percentile(runs, 0.5), P99: report.Percentile(runs, 0.99),
		Baseline: inside, BaseP99: insideP99, BaseName: "the same in python, no execd",
		Note: fmt.Sprintf("`%s`; %d runs after 3 warm-ups; PNG of %d bytes", plotCode, len(runs), size)}
	r.Ratio = r.Baseline / r.Value
	return r, nil
}

// plotsInsideCode draws the plot and renders it as the driver does
// (savefig to PNG, base64), timed by python itself: the cost of the plot
// with no execd, no driver protocol and no HTTP. %d is the number of timed
// runs, after 3 untimed ones.
const plotsInsideCode = `import io, time, binascii, matplotlib.pyplot as plt
_t = []
for _ in range(3 + %d):
    _s = time.perf_counter()
    plt.plot([1,2,3]); _b = io.BytesIO(); plt.gcf().savefig(_b, format="png", bbox_inches="tight")
    binascii.b2a_base64(_b.getvalue(), newline=False); plt.close("all")
    _t.append(time.perf_counter() - _s)
_t = sorted(_t[3:])
print(_t[len(_t) // 2] * 1000, _t[int((len(_t) - 1) * 0.99)] * 1000)
`

// plotsInside returns the p50 and p99 of the plot timed inside the
// interpreter, in milliseconds.
func (b *bench) plotsInside(id string) (p50, p99 float64, err error) {
	evs, err := b.run(id, "python", fmt.Sprintf(plotsInsideCode, b.set.plots))
	if err != nil {
		return 0, 0, err
	}
	var out strings.Builder
	for _, ev := range evs {
		if ev.Type == api.EventStdout {
			out.WriteString(ev.Text)
		}
	}
	if _, err := fmt.Sscan(out.String(), &p50, &p99); err != nil {
		return 0, 0, fmt.Errorf("plot timed inside python: read %q: %w", out.String(), err)
	}
	return p50, p99, nil
}

// pngSize checks that the events of a run carry exactly one image/png
// result that decodes to a PNG file, and returns its size.
func pngSize(evs []api.Event) (int, error) {
	var pngs []string
	for _, ev := range evs {
		if ev.Type != api.EventResult {
			continue
		}
		if s, ok := ev.Results["image/png"].(string); ok {
			pngs = append(pngs, s)
		}
	}
	if len(pngs) != 1 {
		return 0, fmt.Errorf("plot: %d image/png results, want 1", len(pngs))
	}
	data, err := base64.StdEncoding.DecodeString(pngs[0])
	if err != nil {
		return 0, fmt.Errorf("plot: image/png is not base64: %w", err)
	}
	if !bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")) {
		return 0, fmt.Errorf("plot: image/png does not start with the PNG signature")
	}
	return len(data), nil
}

// timeRow compares the durations of execd with those of a baseline.
func timeRow(name string, ours, theirs []time.Duration, baseName, target, note string) row {
	r := row{Name: name, Unit: "ms",
		Value: report.Percentile(ours, 0.5), P99: report.Percentile(ours, 0.99),
		Baseline: report.Percentile(theirs, 0.5), BaseP99: report.Percentile(theirs, 0.99), BaseName: baseName,
		Target: target, Note: note}
	r.Ratio = r.Baseline / r.Value
	return r
}

// progress prints one measure on stderr as the run goes.
func progress(what string, ds []time.Duration) {
	fmt.Fprintf(os.Stderr, "  %s: p50 %.2f ms, p99 %.2f ms, mean %.2f ms (%d runs)\n",
		what, report.Percentile(ds, 0.5), report.Percentile(ds, 0.99), report.Mean(ds), len(ds))
}

// dockerOut runs the docker CLI (see benchkit.Docker).
func dockerOut(args ...string) (string, error) {
	return benchkit.Docker(context.Background(), 2*time.Minute, args...)
}

// req builds a request to execd with the token and, when body is not
// nil, body as JSON.
func (b *bench) req(method, path string, body any) *http.Request {
	var r io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		r = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, b.base+path, r)
	req.Header.Set(api.HeaderExecdToken, b.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// waitReady waits until execd answers /ping.
func (b *bench) waitReady() error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := b.hc.Do(b.req("GET", "/ping", nil))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
	}
	return errors.New("execd did not answer /ping within 10 s")
}

// notOffered is execd's 400 to a context of a language it has no driver
// for.
type notOffered struct{ msg string }

func (e *notOffered) Error() string { return e.msg }

// createContext starts a context of language; it returns when execd
// answers, which is when the interpreter is ready to run code.
func (b *bench) createContext(language string) (string, error) {
	resp, err := b.hc.Do(b.req("POST", "/code/context", api.CodeContext{Language: language}))
	if err != nil {
		return "", fmt.Errorf("create %s context: %w", language, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("create %s context: %w", language, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusBadRequest:
		var e api.ErrorResponse
		if json.Unmarshal(data, &e) != nil || e.Message == "" {
			e.Message = string(bytes.TrimSpace(data))
		}
		return "", &notOffered{"400 " + e.Message}
	default:
		return "", fmt.Errorf("create %s context: status %d: %s", language, resp.StatusCode, data)
	}
	var cc api.CodeContext
	if err := json.Unmarshal(data, &cc); err != nil || cc.ID == "" {
		return "", fmt.Errorf("create %s context: bad answer %q: %v", language, data, err)
	}
	return cc.ID, nil
}

// deleteContext ends a code context.
func (b *bench) deleteContext(id string) error {
	resp, err := b.hc.Do(b.req("DELETE", "/code/contexts/"+id, nil))
	if err != nil {
		return fmt.Errorf("delete context %s: %w", id, err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("delete context %s: status %d: %s", id, resp.StatusCode, data)
	}
	return nil
}

// run runs code in context id and reads its stream to the end, returning
// the events; an error event or a stream without execution_complete is an
// error.
func (b *bench) run(id, language, code string) ([]api.Event, error) {
	resp, err := b.hc.Do(b.req("POST", "/code", api.RunCodeRequest{Code: code, Context: &api.CodeContext{ID: id, Language: language}}))
	if err != nil {
		return nil, fmt.Errorf("run %q: %w", code, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("run %q: status %d: %s", code, resp.StatusCode, data)
	}
	dec := api.NewEventDecoder(resp.Body)
	var evs []api.Event
	for {
		ev, err := dec.Next()
		if err != nil {
			return evs, fmt.Errorf("run %q: stream ended before execution_complete: %w", code, err)
		}
		evs = append(evs, ev)
		switch ev.Type {
		case api.EventError:
			return evs, fmt.Errorf("run %q: %s: %s", code, ev.Error.EName, ev.Error.EValue)
		case api.EventComplete:
			// The stream ends here; reading its end lets the connection
			// be reused.
			io.Copy(io.Discard, resp.Body)
			return evs, nil
		}
	}
}

// runSum runs `1+1` in a warm context and checks that its result is 2.
func (b *bench) runSum(id, language string) error {
	evs, err := b.run(id, language, "1+1")
	if err != nil {
		return err
	}
	for _, ev := range evs {
		if ev.Type == api.EventResult {
			if text, _ := ev.Results["text"].(string); text == "2" {
				return nil
			}
		}
	}
	return fmt.Errorf("run `1+1` in %s: no result with text 2 in %+v", language, evs)
}

// command runs cmd through POST /command and checks that it printed want
// and exited 0.
func (b *bench) command(cmd, want string) error {
	resp, err := b.hc.Do(b.req("POST", "/command", api.RunCommandRequest{Command: cmd}))
	if err != nil {
		return fmt.Errorf("command %q: %w", cmd, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("command %q: status %d: %s", cmd, resp.StatusCode, data)
	}
	dec := api.NewEventDecoder(resp.Body)
	var stdout strings.Builder
	for {
		ev, err := dec.Next()
		if err != nil {
			return fmt.Errorf("command %q: stream ended before execution_complete: %w", cmd, err)
		}
		switch ev.Type {
		case api.EventStdout:
			stdout.WriteString(ev.Text)
		case api.EventError:
			return fmt.Errorf("command %q: %s: %s", cmd, ev.Error.EName, ev.Error.EValue)
		case api.EventComplete:
			io.Copy(io.Discard, resp.Body)
			if got := strings.TrimSpace(stdout.String()); got != want {
				return fmt.Errorf("command %q printed %q, want %q", cmd, got, want)
			}
			return nil
		}
	}
}
