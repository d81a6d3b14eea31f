package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// execdPath is where the tests mount execd inside containers.
const execdPath = "/opt/opensandbox/bin/execd"

// container is a container running execd as its init, with a client for
// execd's API.
type container struct {
	t     *testing.T
	id    string
	base  string // http://127.0.0.1:port
	token string
	hc    *http.Client
}

// startContainer runs image with execd as PID 1 and entrypoint after
// "--", publishes execd's port on 127.0.0.1 and waits until it answers.
// extra are additional docker run flags.
func startContainer(t *testing.T, image string, extra []string, entrypoint ...string) *container {
	t.Helper()
	testenv.MustHaveImage(t, image)
	var b [16]byte
	rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	args := []string{"run", "-d", "--label", "osb-e2e=1", "-p", "127.0.0.1::" + execdPort,
		"-v", execdBin + ":" + execdPath + ":ro", "--entrypoint", execdPath}
	args = append(args, extra...)
	args = append(args, image, "--access-token", token)
	if len(entrypoint) > 0 {
		args = append(append(args, "--"), entrypoint...)
	}
	id := strings.TrimSpace(docker(t, args...))
	c := &container{t: t, id: id, token: token, hc: &http.Client{}}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", "--tail", "50", id).CombinedOutput()
			t.Logf("container log:\n%s", logs)
		}
		exec.Command("docker", "rm", "-f", id).Run()
	})
	port := strings.TrimSpace(docker(t, "port", id, execdPort+"/tcp"))
	c.base = "http://" + strings.Split(port, "\n")[0]
	var last error
	testwait.Until(t, "execd in "+image+" to answer", func() bool {
		req, _ := http.NewRequest("GET", c.base+"/ping", nil)
		req.Header.Set(api.HeaderExecdToken, token)
		resp, err := c.hc.Do(req)
		if last = err; err != nil {
			return false
		}
		resp.Body.Close()
		last = fmt.Errorf("ping: %s", resp.Status)
		return resp.StatusCode == 200
	}, func() string { return fmt.Sprintf("last ping: %v\n%s", last, testwait.Containers("id="+id)) })
	return c
}

// docker runs the docker CLI and returns its output, failing the test on
// error.
func docker(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// request sends a request with the token; body is JSON unless it is a
// string or an io.Reader.
func (c *container) request(method, path string, body any, header ...string) *http.Response {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case io.Reader:
		rd = b
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(c.t.Context(), method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set(api.HeaderExecdToken, c.token)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// call sends a request, checks the status and decodes JSON into out.
func (c *container) call(method, path string, body any, want int, out any) []byte {
	c.t.Helper()
	resp := c.request(method, path, body)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		c.t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			c.t.Fatalf("%s %s: %v in %s", method, path, err, data)
		}
	}
	return data
}

// result is a finished command as a client sees it.
type result struct {
	id     string
	stdout string
	stderr string
	exit   string // "0", the error evalue, or "" when the stream had no terminal event
	events []api.Event
}

// stream runs a streaming request and collects its events.
func (c *container) stream(path string, body any) result {
	c.t.Helper()
	resp := c.request("POST", path, body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("POST %s: %d %s", path, resp.StatusCode, data)
	}
	var r result
	var out, errs []string
	dec := api.NewEventDecoder(resp.Body)
	for {
		ev, err := dec.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			c.t.Fatalf("POST %s: %v", path, err)
		}
		r.events = append(r.events, ev)
		switch ev.Type {
		case api.EventInit:
			r.id = ev.Text
		case api.EventStdout:
			out = append(out, ev.Text)
		case api.EventStderr:
			errs = append(errs, ev.Text)
		case api.EventComplete:
			r.exit = "0"
		case api.EventError:
			r.exit = ev.Error.EValue
		}
	}
	r.stdout, r.stderr = strings.Join(out, "\n"), strings.Join(errs, "\n")
	return r
}

// run runs a foreground command.
func (c *container) run(command string) result {
	c.t.Helper()
	return c.stream("/command", api.RunCommandRequest{Command: command})
}

// mustRun runs a command that must succeed and returns its stdout.
func (c *container) mustRun(command string) string {
	c.t.Helper()
	r := c.run(command)
	if r.exit != "0" {
		c.t.Fatalf("%q: exit %q, stdout %q, stderr %q", command, r.exit, r.stdout, r.stderr)
	}
	return r.stdout
}
