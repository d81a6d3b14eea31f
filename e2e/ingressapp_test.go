package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// What the gateway tests on Docker (ingress_test.go) and on the local
// cluster (k8sgateway_test.go) share: the web app they run in a sandbox
// and the checks of what must stream through the gateway.

// ingressApp is the web app the gateway tests run in a sandbox (python3,
// standard library only): a page with a script and relative assets,
// /headers, /echo, /sse, /big and a WebSocket echo at /ws.
//
//go:embed testdata/ingressapp.py
var ingressApp string

// appPorts are where the app listens in its sandbox: 8080, which Docker
// publishes directly, and one that is reached through execd's port
// proxy (on Kubernetes both are ports of the pod).
const appPort, appPort2 = 8080, 9000

// ingressAppCommand is the argv that runs the app on appPort and
// appPort2; APP_WORD in its environment is the word its asset says.
func ingressAppCommand() []string {
	return []string{"python3", "-c", ingressApp, strconv.Itoa(appPort), strconv.Itoa(appPort2)}
}

// appAsset is the body of the app's /asset.json with word, as Python's
// json.dumps writes it.
func appAsset(word string) string { return `{"word": "` + word + `"}` }

// wantAppAsset checks that a request reached the app: its asset, with
// the sandbox's word.
func wantAppAsset(t *testing.T, what, word string, resp *http.Response, body []byte) {
	t.Helper()
	var a struct{ Word string }
	if resp.StatusCode != 200 || json.Unmarshal(body, &a) != nil || a.Word != word {
		t.Errorf("%s: %s %q, want the app's asset with word %s", what, resp.Status, body, word)
	}
}

// appRequest is what the app saw of a request (GET /headers).
type appRequest struct {
	Path    string            `json:"path"`
	Host    string            `json:"host"`
	Port    int               `json:"port"`
	Headers map[string]string `json:"headers"`
}

func (r appRequest) header(name string) string {
	for k, v := range r.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// wsEcho opens a WebSocket and checks that a text and a 200 KiB binary
// message come back.
func wsEcho(t *testing.T, hc *http.Client, what, url string, header http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: header})
	if err != nil {
		status := ""
		if resp != nil {
			status = resp.Status
		}
		t.Errorf("WebSocket (%s) %s: %s %v", what, url, status, err)
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	bin := make([]byte, 200<<10)
	rand.Read(bin)
	for _, m := range []struct {
		typ  websocket.MessageType
		data []byte
	}{{websocket.MessageText, []byte("hello " + what)}, {websocket.MessageBinary, bin}} {
		if err := conn.Write(ctx, m.typ, m.data); err != nil {
			t.Errorf("WebSocket (%s): write: %v", what, err)
			return
		}
		typ, data, err := conn.Read(ctx)
		if err != nil || typ != m.typ || !bytes.Equal(data, m.data) {
			t.Errorf("WebSocket (%s): echo of %d bytes: %v, %d bytes back, %v", what, len(m.data), typ, len(data), err)
			return
		}
	}
	if err := conn.Close(websocket.StatusNormalClosure, ""); err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("WebSocket (%s): close: %v", what, err)
	}
}

// wantSSE asks the app at base (the route's base URL) for n server-sent
// events every apart and checks that they arrive one by one: a gateway
// that held them back would hand them over together at the end. The
// only timing it asserts is that much: the last event comes at least
// half of the app's spread after the first.
func wantSSE(t *testing.T, hc *http.Client, what, base string, header http.Header, n int, every time.Duration) {
	t.Helper()
	req, err := http.NewRequest("GET", fmt.Sprintf("%s/sse?n=%d&ms=%d", base, n, every.Milliseconds()), nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		t.Errorf("SSE (%s): %v", what, err)
		return
	}
	var arrivals []time.Duration
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: event ") {
			arrivals = append(arrivals, time.Since(start))
		}
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); len(arrivals) != n || ct != "text/event-stream" || sc.Err() != nil {
		t.Errorf("SSE (%s): %s, %d of %d events, content type %q, %v", what, resp.Status, len(arrivals), n, ct, sc.Err())
		return
	}
	sent := time.Duration(n-1) * every
	if spread := arrivals[n-1] - arrivals[0]; spread < sent/2 {
		t.Errorf("SSE (%s): events arrived at %v, within %v (the app sends one every %v)", what, arrivals, spread, every)
	}
	t.Logf("SSE (%s): %d events arrived at %v", what, n, roundAll(arrivals))
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// h2cClient is a client that speaks HTTP/2 without TLS (prior
// knowledge) over a clone of tr.
func h2cClient(tr *http.Transport) *http.Client {
	tr = tr.Clone()
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// getH2 sends GET url with header through hc and checks that the answer
// came in HTTP/2; it returns the response and its body.
func getH2(t *testing.T, hc *http.Client, url string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("HTTP/2 GET %s: %v", url, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("HTTP/2 GET %s: reading the body: %v", url, err)
	}
	if resp.ProtoMajor != 2 {
		t.Errorf("GET %s answered in %s, want HTTP/2", url, resp.Proto)
	}
	return resp, body
}

// downloadSize is the size of the download that must stream through the
// gateway with bounded memory.
const downloadSize = 1 << 30

// downloadGrowthMax is how much the gateway's resident memory may grow
// while downloadSize bytes go through it.
const downloadGrowthMax = 64 << 20

// wantBoundedDownload downloads downloadSize bytes from the app at base
// through hc and, while the body streams, samples the gateway's
// resident memory with rss every period: it must be measured at least 5
// times and grow by no more than downloadGrowthMax.
func wantBoundedDownload(t *testing.T, hc *http.Client, base string, header http.Header, rss func() (int64, error), every time.Duration) {
	t.Helper()
	before, err := rss()
	if err != nil {
		t.Fatalf("the gateway's memory before the download: %v", err)
	}
	req, err := http.NewRequest("GET", base+"/big?n="+strconv.Itoa(downloadSize), nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /big through the gateway: %s", resp.Status)
	}
	var peak int64
	samples := 0
	var lastErr error
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				if v, err := rss(); err == nil {
					peak = max(peak, v)
					samples++
				} else {
					lastErr = err
				}
			case <-stop:
				return
			}
		}
	}()
	n, err := io.Copy(io.Discard, resp.Body)
	close(stop)
	<-sampled
	took := time.Since(start)
	if err != nil || n != downloadSize {
		t.Fatalf("1 GiB through the gateway: %d bytes, %v", n, err)
	}
	t.Logf("1 GiB through the gateway in %v (%.0f MiB/s); gateway RSS %d MiB before, peak %d MiB in %d samples",
		took.Round(time.Millisecond), float64(downloadSize)/(1<<20)/took.Seconds(), before>>20, peak>>20, samples)
	if samples < 5 {
		t.Errorf("the gateway's memory was measured %d times during the download (last error %v)", samples, lastErr)
	}
	if peak > before+downloadGrowthMax {
		t.Errorf("the gateway's memory grew from %d MiB to %d MiB during a 1 GiB download", before>>20, peak>>20)
	}
}

// scrapeMetrics reads a Prometheus text exposition at url: each sample
// line's series (name and labels as written) and value.
func scrapeMetrics(hc *http.Client, url string) (map[string]float64, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	values := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(line, "#") {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %v", url, line, err)
			}
			values[f[0]] = v
		}
	}
	return values, nil
}
