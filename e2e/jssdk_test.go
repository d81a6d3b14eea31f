package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// jssdkLanguages are the code-context languages TestJSSDK drives.
var jssdkLanguages = []string{"python", "javascript", "typescript", "java", "go"}

// jssdkReport is what each script of testdata/jssdk prints last (see
// lib.mjs): the sandboxes it made, the checks that failed, notes, and an
// error that stopped it.
type jssdkReport struct {
	IDs      []string
	Failures []string
	Notes    []string
	Error    string
}

// TestJSSDK drives the real server and images through the published
// JavaScript SDK as its users do, one script per area, in parallel: a
// sandbox's lifecycle with its endpoints and metrics (lifecycle.mjs);
// commands, bash sessions and files (execd.mjs); code contexts in every
// language, several at once in one code-interpreter sandbox (code.mjs).
// The scripts check what the SDK hands back against the protocol and
// report each mismatch; every sandbox they made must be gone at the end.
func TestJSSDK(t *testing.T) {
	dir := jssdk(t)
	s := startServer(t, serverOptions{})
	for _, tc := range []struct {
		script string
		image  string
		env    []string
	}{
		{script: "lifecycle.mjs"},
		{script: "execd.mjs"},
		{script: "code.mjs", image: interpreterImage, env: []string{
			"OSB_CODE_IMAGE=" + interpreterImage,
			"OSB_CODE_LANGS=" + strings.Join(jssdkLanguages, ","),
		}},
	} {
		t.Run(strings.TrimSuffix(tc.script, ".mjs"), func(t *testing.T) {
			t.Parallel()
			if tc.image != "" {
				testenv.MustHaveImage(t, tc.image)
			}
			line := runJSScript(t, dir, s, tc.script, tc.env...)
			var rep jssdkReport
			if err := json.Unmarshal([]byte(line), &rep); err != nil {
				t.Fatalf("report: %v in %s", err, line)
			}
			for _, n := range rep.Notes {
				t.Log(n)
			}
			for _, f := range rep.Failures {
				t.Error(f)
			}
			if rep.Error != "" {
				t.Errorf("the script stopped: %s", rep.Error)
			}
			for _, id := range rep.IDs {
				s.waitGone(id)
			}
		})
	}
}
