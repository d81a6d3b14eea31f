package e2e

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// browser starts a headless Chromium (the one at path) for the test and
// returns a context of a tab in it. Every name under .test resolves to
// 127.0.0.1 and no other name resolves at all, so the browser reaches
// nothing but this machine's loopback.
func browser(t *testing.T, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("host-resolver-rules", "MAP *.test 127.0.0.1, MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.Flag("no-proxy-server", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, cancelA := chromedp.NewExecAllocator(t.Context(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelB(); cancelA() })
	// Start the browser now, so that a broken install fails here.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return ctx
}

// renderedPage opens url in the tab and waits until the page's script has
// run (it sets the title to "done" after fetching its asset). It returns
// the text of the page's status paragraph and the URLs of the resources
// the page loaded.
func renderedPage(t *testing.T, tab context.Context, url, shot string) (status string, loaded []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	fail := func(err error) {
		t.Helper()
		body, _ := chromedp.Run(tab, chromedp.Text(chromedp.CSS("body")))
		t.Fatalf("open %s in Chromium: %v; the page says %q", url, err, body)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		fail(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.title === "done"`, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		fail(err)
	}
	status, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#status")))
	if err != nil {
		fail(err)
	}
	loaded, err = chromedp.Run(ctx, chromedp.Evaluate[[]string](`performance.getEntriesByType("resource").map(e => e.name)`))
	if err != nil {
		fail(err)
	}
	if dir := os.Getenv("OSB_E2E_SCREENSHOTS"); dir != "" {
		if png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot()); err == nil {
			os.WriteFile(filepath.Join(dir, shot+".png"), png, 0o644)
		}
	}
	return status, loaded
}

// TestIngressBrowser opens a sandbox's web app in headless Chromium
// through osb-ingress, by the signed links the endpoint API hands out (a
// path route, then a subdomain route), and checks the page as rendered:
// its script, loaded by a relative URL through the gateway, fetched a
// relative asset through the gateway and wrote the sandbox's word into
// the page. A link without a signature shows the gateway's refusal.
func TestIngressBrowser(t *testing.T) {
	chromium := testenv.MustHaveChromium(t)
	key := ingressKey('k')
	st := startIngressStack(t, "uri", nil, key)
	tab := browser(t, chromium)
	want := "rendered by js: " + st.word

	// open checks the page at a link: rendered by its script, which and
	// whose asset came through the gateway under the same link.
	open := func(what, link string) {
		t.Helper()
		base := strings.TrimSuffix(link, "/")
		status, loaded := renderedPage(t, tab, base+"/", "ingress-"+what)
		if status != want {
			t.Errorf("%s link: the page says %q, want %q", what, status, want)
		}
		for _, res := range []string{base + "/app.js", base + "/asset.json"} {
			if !slices.Contains(loaded, res) {
				t.Errorf("%s link: the page loaded %q, not %s", what, loaded, res)
			}
		}
	}

	ep := st.endpoint(st.app, appPort, expiresIn(time.Hour))
	if len(ep.Headers) != 0 || !strings.HasPrefix(ep.Endpoint, st.gwAddr+"/"+st.app+"/") {
		t.Fatalf("signed uri endpoint %+v: want a link a browser can open, without headers", ep)
	}
	open("uri", "http://"+ep.Endpoint)

	// Without the signature the gateway refuses, in its error envelope.
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(st.uri(st.app, appPort)+"/")); err != nil {
		t.Fatal(err)
	}
	body, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, api.CodeIngressUnauthorized) || strings.Contains(body, st.word) {
		t.Errorf("unsigned link: the page says %q, want the gateway's %s", body, api.CodeIngressUnauthorized)
	}

	// Subdomain routes: the signed route is the host's first label. The
	// link is the one osb prints for a person to open.
	st.reconfigure("wildcard", key)
	link := strings.TrimSpace(st.s.osb("sandbox", "endpoint", st.app, strconv.Itoa(appPort), "--expires", "1h").ok(t))
	_, gwPort, _ := net.SplitHostPort(st.gwAddr)
	if !strings.HasPrefix(link, "http://"+st.app+"-"+strconv.Itoa(appPort)+"-") || !strings.Contains(link, "."+ingressDomain+":"+gwPort) {
		t.Fatalf("osb sandbox endpoint --expires printed %q, want a signed subdomain link", link)
	}
	open("wildcard", link)
}
