package e2e

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

// TestMetrics: after one busybox sandbox, the real server's /metrics
// shows its cold create, the sandbox in the state gauge and the create
// request under its route pattern, with the key sent as Prometheus sends
// it; without credentials /metrics is refused.
func TestMetrics(t *testing.T) {
	s := startServer(t, serverOptions{})
	var created api.CreateSandboxResponse
	s.call("POST", "/v1/sandboxes", sandboxRequest(busyboxImage, "sleep", "1000000"), 202, &created)
	s.waitState(created.ID, "Running")

	resp, body := s.do("GET", "/metrics", nil, api.HeaderAPIKey, "", "Authorization", "Bearer "+s.key)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics with a bearer token: %d %s", resp.StatusCode, body)
	}
	text := string(body)
	value := func(series string) float64 {
		t.Helper()
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no %s in /metrics:\n%s", series, text)
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatalf("%s: %v", series, err)
		}
		return v
	}
	if n := value(`opensandbox_sandbox_create_duration_seconds_count{mode="cold"}`); n != 1 {
		t.Errorf("cold creates: %g, want 1", n)
	}
	if sum := value(`opensandbox_sandbox_create_duration_seconds_sum{mode="cold"}`); sum <= 0 || sum > 60 {
		t.Errorf("cold create took %gs", sum)
	}
	if n := value(`opensandbox_sandboxes{state="Running"}`); n != 1 {
		t.Errorf("running sandboxes: %g, want 1", n)
	}
	if n := value(`opensandbox_http_request_duration_seconds_count{code="202",method="POST",route="/sandboxes"}`); n != 1 {
		t.Errorf("create requests: %g, want 1", n)
	}
	if regexp.MustCompile(`route="[^"]*` + regexp.QuoteMeta(created.ID)).MatchString(text) {
		t.Errorf("a route label carries the sandbox id")
	}
	if resp, body := s.do("GET", "/metrics", nil, api.HeaderAPIKey, ""); resp.StatusCode != 401 {
		t.Errorf("GET /metrics without credentials: %d %s", resp.StatusCode, body)
	}
}
