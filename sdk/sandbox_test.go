package sdk_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

var requestIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestLifecycle(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	label := map[string]string{"suite": "lifecycle-" + strings.ToLower(t.Name()[4:8])}
	sb := newSandbox(t, c, sdk.CreateOptions{Image: busyboxImage, Metadata: label, Env: map[string]string{"GREETING": "hi"}, Timeout: 20 * time.Minute})

	info, err := sb.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status.State != sdk.StateRunning || info.Metadata["suite"] != label["suite"] || info.ExpiresAt == nil {
		t.Errorf("info: %+v", info)
	}
	if d := time.Until(*info.ExpiresAt); d < 19*time.Minute || d > 21*time.Minute {
		t.Errorf("expires in %v", d)
	}
	res, err := sb.Run(ctx, "echo $GREETING", nil)
	if err != nil || res.Stdout != "hi\n" {
		t.Errorf("env: %+v %v", res, err)
	}

	// Two more, then page through all three one at a time.
	for range 2 {
		newSandbox(t, c, sdk.CreateOptions{Image: busyboxImage, Metadata: label, SkipHealthCheck: true})
	}
	var ids []string
	for s, err := range c.All(ctx, sdk.ListOptions{Metadata: label, PageSize: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	if len(ids) != 3 {
		t.Errorf("All yielded %v", ids)
	}
	page, err := c.List(ctx, sdk.ListOptions{Metadata: label, States: []string{sdk.StatePaused}})
	if err != nil || len(page.Items) != 0 {
		t.Errorf("paused: %+v %v", page, err)
	}

	// Renew, patch metadata.
	at, err := sb.Renew(ctx, time.Hour)
	if err != nil || time.Until(at) < 59*time.Minute {
		t.Errorf("renew: %v %v", at, err)
	}
	v := "x"
	patched, err := c.PatchMetadata(ctx, sb.ID, map[string]*string{"extra": &v, "suite": nil})
	if err != nil || patched.Metadata["extra"] != "x" || patched.Metadata["suite"] != "" {
		t.Errorf("patch: %+v %v", patched, err)
	}

	// A process survives pause and resume. The counter is written to a
	// new file and renamed, so a read never meets it half written.
	if _, err := sb.RunBackground(ctx, "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done", nil); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		b, err := sb.ReadFile(ctx, "/tmp/count")
		if err != nil {
			t.Fatalf("read the counter: %v", err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("the counter reads %q", b)
		}
		return n
	}
	waitCount := func(above int) int {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := sb.ReadFile(ctx, "/tmp/count"); err == nil {
				if n := count(); n > above {
					return n
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the counter did not pass %d within 10s", above)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitCount(0)
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ := sb.Info(ctx); info.Status.State != sdk.StatePaused {
		t.Errorf("after pause: %s", info.Status.State)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	waitCount(count())

	// Endpoints, direct and through the server.
	ep, err := sb.Endpoint(ctx, sdk.PortExecd)
	if err != nil || !strings.HasPrefix(ep.Endpoint, "127.0.0.1:") || ep.Headers[api.HeaderExecdToken] == "" {
		t.Errorf("endpoint: %+v %v", ep, err)
	}
	pc := newClient(t, func(cfg *sdk.Config) { cfg.UseServerProxy = true })
	pep, err := pc.Endpoint(ctx, sb.ID, sdk.PortExecd)
	if err != nil || !strings.Contains(pep.Endpoint, "/sandboxes/"+sb.ID+"/proxy/"+strconv.Itoa(sdk.PortExecd)) {
		t.Errorf("proxied endpoint: %+v %v", pep, err)
	}

	// Kill, then every call says not found with the server's details.
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = sb.Info(ctx)
	var ae *sdk.APIError
	if !errors.As(err, &ae) || !errors.Is(err, sdk.ErrNotFound) || !strings.HasSuffix(ae.Code, "SANDBOX_NOT_FOUND") || !requestIDRE.MatchString(ae.RequestID) {
		t.Errorf("after kill: %#v", err)
	}
}

func TestCreateErrors(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	if _, err := c.Create(ctx, sdk.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "an image, a snapshot or a pool is required") {
		t.Errorf("no image: %v", err)
	}
	_, err := c.Create(ctx, sdk.CreateOptions{Image: busyboxImage, Resources: map[string]string{"memory": "lots"}})
	if !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("bad memory: %v", err)
	}
	// An image that is nowhere fails the create, and the failed sandbox
	// is removed.
	_, err = c.Create(ctx, sdk.CreateOptions{Image: "127.0.0.1:1/none/such:image", Metadata: map[string]string{"suite": "create-errors"}})
	if err == nil {
		t.Fatal("create of a missing image succeeded")
	}
	page, _ := c.List(ctx, sdk.ListOptions{Metadata: map[string]string{"suite": "create-errors"}})
	if page != nil && len(page.Items) != 0 {
		t.Errorf("a failed create left %d sandboxes", len(page.Items))
	}
	bad, _ := sdk.NewClient(sdk.Config{Domain: server.Addr, APIKey: "wrong"})
	if _, err := bad.List(ctx, sdk.ListOptions{}); !errors.Is(err, sdk.ErrUnauthorized) {
		t.Errorf("wrong key: %v", err)
	}
}

func TestCommands(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	sb := newSandbox(t, c, sdk.CreateOptions{Image: busyboxImage})

	// Output goes to the writers as it comes, stdout and stderr apart.
	var stdout, stderr bytes.Buffer
	var events []string
	res, err := sb.Run(ctx, "echo out1; echo err1 >&2; echo; printf 'no newline'; exit 7", &sdk.RunOptions{
		Stdout: &stdout, Stderr: &stderr, OnEvent: func(ev api.Event) { events = append(events, ev.Type) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if stdout.String() != "out1\n\nno newline\n" || stderr.String() != "err1\n" {
		t.Errorf("stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	if res.ExitCode != 7 || res.OK() || res.Error.EName != api.ErrorNameCommand || res.ID == "" || res.Stdout != "" {
		t.Errorf("result %+v", res)
	}
	if events[0] != api.EventInit || events[len(events)-1] != api.EventError {
		t.Errorf("events %v", events)
	}

	// Cwd, env, user, collected output.
	uid := uint32(65534)
	res, err = sb.Run(ctx, "pwd; echo $X; id -u", &sdk.RunOptions{Cwd: "/tmp", Env: map[string]string{"X": "y"}, UID: &uid})
	if err != nil || res.Stdout != "/tmp\ny\n65534\n" || res.ExitCode != 0 || !res.OK() {
		t.Errorf("options: %+v %v", res, err)
	}

	// A timeout kills the command.
	res, err = sb.Run(ctx, "sleep 30", &sdk.RunOptions{Timeout: 300 * time.Millisecond})
	if err != nil || res.ExitCode != -1 || res.Signal() == "" {
		t.Errorf("timeout: %+v %v", res, err)
	}

	// A stream yields events; Interrupt stops the command.
	st, err := sb.Stream(ctx, "echo started; sleep 30", nil)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Next()
	if err != nil || ev.Type != api.EventInit || ev.Text != st.ID() {
		t.Fatalf("first event %+v %v", ev, err)
	}
	for {
		ev, err := st.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == api.EventStdout {
			break
		}
	}
	if err := sb.Interrupt(ctx, st.ID()); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.Next(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if r := st.Result(); r.ExitCode != -1 || r.Stdout != "started\n" {
		t.Errorf("interrupted: %+v", r)
	}

	// Background: status, logs from a cursor, following to the end.
	id, err := sb.RunBackground(ctx, "for i in 1 2 3; do echo line $i; sleep 0.2; done; exit 4", nil)
	if err != nil {
		t.Fatal(err)
	}
	var followed bytes.Buffer
	status, err := sb.FollowLogs(ctx, id, &followed, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if followed.String() != "line 1\nline 2\nline 3\n" || status.Running || status.ExitCode == nil || *status.ExitCode != 4 {
		t.Errorf("followed %q, status %+v", followed.String(), status)
	}
	logs, next, err := sb.CommandLogs(ctx, id, 7)
	if err != nil || string(logs) != "line 2\nline 3\n" || next != 21 {
		t.Errorf("logs from 7: %q, next %d, %v", logs, next, err)
	}
	if _, err := sb.CommandStatus(ctx, "no-such-command"); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("unknown command: %v", err)
	}
}

func TestSessions(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	sb := newSandbox(t, c, sdk.CreateOptions{Image: pythonImage})
	sess, err := sb.CreateSession(ctx, "/tmp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sess.Run(ctx, "greet() { echo hello $1; }; secret=42; cd /etc", nil); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res, err := sess.Run(ctx, "greet world; echo $secret $PWD; false", &sdk.SessionRunOptions{Stdout: &out})
	if err != nil || out.String() != "hello world\n42 /etc\n" || res.ExitCode != 1 {
		t.Errorf("run: %q %+v %v", out.String(), res, err)
	}
	if err := sess.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sess.Run(ctx, "true", nil); err == nil {
		t.Error("run in a deleted session succeeded")
	}
}

func TestTerminal(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	sb := newSandbox(t, c, sdk.CreateOptions{Image: pythonImage})
	term, err := sb.OpenTerminal(ctx, sdk.TerminalOptions{Cwd: "/tmp", Cols: 100, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	screen := &syncBuffer{}
	go io.Copy(screen, term)
	waitFor := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); !strings.Contains(screen.String(), want); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("terminal never showed %q: %q", want, screen.String())
			}
		}
	}
	io.WriteString(term, "stty size; echo in $PWD\n")
	waitFor("30 100")
	waitFor("in /tmp")
	if err := term.Resize(120, 40); err != nil {
		t.Fatal(err)
	}
	io.WriteString(term, "stty size\n")
	waitFor("40 120")

	// A second client that takes over ends the first one's attachment.
	taker, err := sb.AttachTerminal(ctx, term.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := term.Wait(); !errors.Is(err, sdk.ErrTakenOver) {
		t.Errorf("after a takeover: %v", err)
	}
	offset := term.Offset()
	taker.Close()

	// Detach, keep working remotely, reattach from where we were.
	again, err := sb.AttachTerminal(ctx, term.ID, offset, false)
	if err != nil {
		t.Fatal(err)
	}
	screen2 := &syncBuffer{}
	go io.Copy(screen2, again)
	io.WriteString(again, "echo back $((40+2)); exit 5\n")
	code, err := again.Wait()
	if err != nil || code != 5 {
		t.Errorf("exit: %d %v", code, err)
	}
	if s := screen2.String(); !strings.Contains(s, "back 42") || strings.Contains(s, "in /tmp") {
		t.Errorf("after reattach: %q", s)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestFiles(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	sb := newSandbox(t, c, sdk.CreateOptions{Image: busyboxImage})

	big := make([]byte, 9<<20+1)
	rand.Read(big)
	err := sb.Upload(ctx,
		sdk.UploadFile{Path: "/data/big.bin", Content: bytes.NewReader(big), Mode: 0o600},
		sdk.UploadFile{Path: "/data/sub/a.txt", Content: strings.NewReader("hello alpha\n"), Owner: "nobody"},
	)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sb.ReadFile(ctx, "/data/big.bin")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big file: %d bytes, %v", len(got), err)
	}
	part, err := sb.DownloadRange(ctx, "/data/big.bin", 1000, 24)
	if err != nil {
		t.Fatal(err)
	}
	chunk, _ := io.ReadAll(part)
	part.Close()
	if !bytes.Equal(chunk, big[1000:1024]) || part.Size != 24 {
		t.Errorf("range: %d bytes (size %d)", len(chunk), part.Size)
	}

	info, err := sb.Stat(ctx, "/data/big.bin", "/data/sub/a.txt")
	if err != nil || info["/data/big.bin"].Mode != 600 || info["/data/big.bin"].Size != int64(len(big)) || info["/data/sub/a.txt"].Owner != "nobody" {
		t.Errorf("stat: %+v %v", info, err)
	}
	list, err := sb.ListDir(ctx, "/data", 2)
	if err != nil || len(list) != 3 {
		t.Errorf("list: %+v %v", list, err)
	}
	found, err := sb.Search(ctx, "/data", "*.txt")
	if err != nil || len(found) != 1 || found[0].Path != "/data/sub/a.txt" {
		t.Errorf("search: %+v %v", found, err)
	}
	if n, err := sb.Replace(ctx, "/data/sub/a.txt", "alpha", "beta"); err != nil || n != 1 {
		t.Errorf("replace: %d %v", n, err)
	}
	if err := sb.Move(ctx, "/data/sub/a.txt", "/data/moved/b.txt"); err != nil {
		t.Fatal(err)
	}
	if err := sb.Chmod(ctx, "/data/moved/b.txt", sdk.Permission{Mode: 0o640, Group: "root"}); err != nil {
		t.Fatal(err)
	}
	if data, _ := sb.ReadFile(ctx, "/data/moved/b.txt"); string(data) != "hello beta\n" {
		t.Errorf("moved: %q", data)
	}
	if info, _ := sb.Stat(ctx, "/data/moved/b.txt"); info["/data/moved/b.txt"].Mode != 640 {
		t.Errorf("chmod: %+v", info)
	}
	if err := sb.Mkdir(ctx, sdk.Permission{Mode: 0o700}, "/data/x/y", "/data/z"); err != nil {
		t.Fatal(err)
	}
	if err := sb.Remove(ctx, "/data/big.bin"); err != nil {
		t.Fatal(err)
	}
	if err := sb.RemoveDir(ctx, "/data/x"); err != nil {
		t.Fatal(err)
	}
	list, _ = sb.ListDir(ctx, "/data", 1)
	var names []string
	for _, f := range list {
		names = append(names, filepath.Base(f.Path))
	}
	if strings.Join(names, ",") != "moved,sub,z" {
		t.Errorf("after removals: %v", names)
	}

	_, err = sb.ReadFile(ctx, "/data/none")
	var ae *sdk.APIError
	if !errors.As(err, &ae) || ae.Code != api.CodeFileNotFound || !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("missing file: %#v", err)
	}
}

func TestCopy(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	sb := newSandbox(t, c, sdk.CreateOptions{Image: busyboxImage})

	src := filepath.Join(t.TempDir(), "proj")
	var total int64
	for i := range 200 {
		p := filepath.Join(src, fmt.Sprintf("dir%d", i%5), fmt.Sprintf("f%03d.dat", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		data := make([]byte, i*37)
		rand.Read(data)
		os.WriteFile(p, data, 0o644)
		total += int64(len(data))
	}
	var mu sync.Mutex
	var last, lastTotal int64
	monotone := true
	progress := func(done, tot int64) {
		mu.Lock()
		defer mu.Unlock()
		if done < last {
			monotone = false
		}
		last, lastTotal = done, tot
	}
	st, err := sb.CopyTo(ctx, src, "/work", &sdk.CopyOptions{Progress: progress})
	if err != nil {
		t.Fatal(err)
	}
	if st.Bytes != total || last != total || lastTotal != total || !monotone {
		t.Errorf("copy in: %+v, progress %d/%d, monotone %v, want %d", st, last, lastTotal, monotone, total)
	}
	back := filepath.Join(t.TempDir(), "back")
	last = 0
	if _, err := sb.CopyFrom(ctx, "/work", back, &sdk.CopyOptions{Progress: progress}); err != nil {
		t.Fatal(err)
	}
	if last != total || lastTotal != total {
		t.Errorf("copy out progress %d/%d, want %d", last, lastTotal, total)
	}
	err = filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		a, _ := os.ReadFile(p)
		b, err := os.ReadFile(filepath.Join(back, rel))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs after the round trip (%v)", rel, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestMetricsAndDiagnostics(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	sb := newSandbox(t, c, sdk.CreateOptions{Image: busyboxImage, Resources: map[string]string{"cpu": "1", "memory": "512Mi"},
		Entrypoint: []string{"sh", "-c", "echo entrypoint says hello; exec sleep 1000"}})
	m, err := sb.Metrics(ctx)
	if err != nil || m.MemTotalMiB != 512 || m.CPUCount != 1 {
		t.Errorf("metrics: %+v %v", m, err)
	}
	n := 0
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for m, err := range sb.WatchMetrics(wctx) {
		if err != nil {
			t.Fatal(err)
		}
		if m.Timestamp == 0 {
			t.Errorf("sample %+v", m)
		}
		if n++; n == 2 {
			break
		}
	}
	var logs *api.DiagnosticContent
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if logs, err = c.Logs(ctx, sb.ID, "container"); err != nil {
			t.Fatal(err)
		}
		if logs.Content != nil && strings.Contains(*logs.Content, "entrypoint says hello") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("logs: %+v", logs)
		}
	}
	events, err := c.Events(ctx, sb.ID, "runtime")
	if err != nil || events.Kind != "events" {
		t.Errorf("events: %+v %v", events, err)
	}
}

func TestSnapshots(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	sb := newSandbox(t, c, sdk.CreateOptions{Image: busyboxImage})
	if err := sb.WriteFile(ctx, "/root/state.txt", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	snap, err := c.CreateSnapshot(ctx, sb.ID, "sdk-test")
	if err != nil {
		t.Fatal(err)
	}
	ready, err := c.WaitSnapshot(ctx, snap.ID)
	if err != nil || ready.Name != "sdk-test" || ready.SandboxID != sb.ID {
		t.Fatalf("snapshot: %+v %v", ready, err)
	}
	list, err := c.ListSnapshots(ctx, sdk.SnapshotListOptions{SandboxID: sb.ID})
	if err != nil || len(list.Items) != 1 {
		t.Errorf("list: %+v %v", list, err)
	}
	restored := newSandbox(t, c, sdk.CreateOptions{SnapshotID: snap.ID})
	if data, err := restored.ReadFile(ctx, "/root/state.txt"); err != nil || string(data) != "kept" {
		t.Errorf("restored: %q %v", data, err)
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSnapshot(ctx, snap.ID); !errors.Is(err, sdk.ErrNotFound) {
		// Deletion may still be under way.
		if s, _ := c.GetSnapshot(ctx, snap.ID); s == nil || s.Status.State != sdk.SnapshotDeleting {
			t.Errorf("after delete: %v", err)
		}
	}
}

// TestThroughServerProxy works inside a sandbox with every request going
// through the server's proxy route.
func TestThroughServerProxy(t *testing.T) {
	c := newClient(t, func(cfg *sdk.Config) { cfg.UseServerProxy = true })
	ctx := t.Context()
	sb := newSandbox(t, c, sdk.CreateOptions{Image: busyboxImage})
	res, err := sb.Run(ctx, "echo via proxy", nil)
	if err != nil || res.Stdout != "via proxy\n" {
		t.Fatalf("run: %+v %v", res, err)
	}
	if err := sb.WriteFile(ctx, "/tmp/p", []byte("proxied"), 0); err != nil {
		t.Fatal(err)
	}
	if data, err := sb.ReadFile(ctx, "/tmp/p"); err != nil || string(data) != "proxied" {
		t.Errorf("file: %q %v", data, err)
	}
	term, err := sb.OpenTerminal(ctx, sdk.TerminalOptions{Command: "echo terminal via proxy"})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(term)
	if code, err := term.Wait(); err != nil || code != 0 || !strings.Contains(string(out), "terminal via proxy") {
		t.Errorf("terminal: %q, %d, %v", out, code, err)
	}
}
