package execd

import (
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

func TestClaim(t *testing.T) {
	_, plain := newTestServer(t, nil)
	plain.wantError("POST", "/claim", api.ClaimRequest{Token: "fresh-token-0123456789"}, 403, api.CodeNotSupported)

	s, c := newTestServer(t, func(cfg *Config) { cfg.Claimable = true })
	c.wantError("POST", "/claim", api.ClaimRequest{Token: "short"}, 400, api.CodeInvalidRequestBody)
	c.wantError("POST", "/claim", api.ClaimRequest{Token: "0123456789abcdef0123", Env: map[string]string{"EXECD_ACCESS_TOKEN": "x"}}, 400, api.CodeInvalidRequestBody)

	const newToken = "fresh-token-0123456789"
	marker := t.TempDir() + "/started"
	c.call("POST", "/claim", api.ClaimRequest{
		Token:      newToken,
		Env:        map[string]string{"STAGE": "claimed"},
		Entrypoint: []string{"sh", "-c", "echo $STAGE > " + marker + "; sleep 30"},
	}, 200, nil)

	// The pool's token no longer works; the new one does.
	c.wantError("GET", "/ping", nil, 401, "")
	c.token = newToken
	c.call("GET", "/ping", nil, 200, nil)

	// The claim's variables reach every later process.
	events := c.stream("/command", api.RunCommandRequest{Command: "echo $STAGE"})
	if out := outputOf(events, api.EventStdout); out != "claimed" {
		t.Errorf("command sees STAGE=%q", out)
	}
	// The entrypoint runs, with them too.
	var st api.CommandStatus
	c.call("GET", "/command/status/"+EntrypointID, nil, 200, &st)
	if !st.Running || s.Entrypoint() == nil {
		t.Errorf("entrypoint status %+v", st)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		events := c.stream("/command", api.RunCommandRequest{Command: "cat " + marker})
		if outputOf(events, api.EventStdout) == "claimed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the entrypoint did not run with the claim's environment")
		}
	}
	// Never twice.
	c.wantError("POST", "/claim", api.ClaimRequest{Token: "another-token-0123456789"}, 409, api.CodeInvalidRequestBody)
}
