package sdk_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"image/png"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sdk"
)

// interpreterImage has python with numpy, pandas and matplotlib, and node.
const interpreterImage = "opensandbox/code-interpreter"

// codeIn runs code in a context and fails the test on a transport error.
func codeIn(t *testing.T, sb *sdk.Sandbox, cc *api.CodeContext, code string) *sdk.Execution {
	t.Helper()
	ex, err := sb.RunCode(t.Context(), code, &sdk.CodeOptions{Context: cc})
	if err != nil {
		t.Fatalf("run %q: %v", code, err)
	}
	return ex
}

// text returns the text/plain of the run's last result.
func text(ex *sdk.Execution) string {
	if len(ex.Results) == 0 {
		return ""
	}
	s, _ := ex.Results[len(ex.Results)-1]["text"].(string)
	return s
}

// checkPNG decodes a base64 PNG result.
func checkPNG(t *testing.T, what string, res map[string]any) {
	t.Helper()
	b64, _ := res["image/png"].(string)
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("%s: image/png is not base64: %v", what, err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s: not a PNG: %v", what, err)
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		t.Errorf("%s: a %v image", what, b)
	}
}

// TestCodeInterpreter drives every language of the code interpreter in a
// real sandbox of the code-interpreter image, through the server.
func TestCodeInterpreter(t *testing.T) {
	testenv.MustHaveImage(t, interpreterImage)
	c := newClient(t)
	sb := newSandbox(t, c, sdk.CreateOptions{Image: interpreterImage, Timeout: 10 * time.Minute})

	t.Run("python", func(t *testing.T) {
		cc, err := sb.CreateCodeContext(t.Context(), sdk.LanguagePython, "/tmp/py")
		if err != nil {
			t.Fatal(err)
		}
		if ex := codeIn(t, sb, cc, "import os\nimport numpy as np\nx = np.arange(4)\ndef total(): return int(x.sum())\nprint(os.getcwd())"); !ex.OK() || ex.Stdout != "/tmp/py\n" {
			t.Fatalf("setup: %+v", ex)
		}
		ex := codeIn(t, sb, cc, "total()")
		if text(ex) != "6" || ex.ExecutionCount != 2 {
			t.Fatalf("state: %+v", ex)
		}
		// A DataFrame comes back as HTML too.
		ex = codeIn(t, sb, cc, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
		if html, _ := ex.Results[0]["text/html"].(string); !strings.Contains(html, "<table") || !strings.Contains(text(ex), "a  b") {
			t.Fatalf("DataFrame: %+v", ex.Results)
		}
		// A plot from plt.show(), and a figure as the last expression.
		ex = codeIn(t, sb, cc, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('shown')\nplt.show()\nprint('after show')")
		if !ex.OK() || len(ex.Results) != 1 || ex.Stdout != "after show\n" {
			t.Fatalf("plt.show(): %+v", ex)
		}
		checkPNG(t, "plt.show()", ex.Results[0])
		ex = codeIn(t, sb, cc, "fig, ax = plt.subplots()\nax.bar(['a', 'b'], [3, 5])\nfig")
		if len(ex.Results) != 1 || !strings.Contains(text(ex), "Figure") {
			t.Fatalf("figure as the last expression: %+v", ex.Results)
		}
		checkPNG(t, "figure result", ex.Results[0])
		// A figure left open at the end of a run is shown once.
		ex = codeIn(t, sb, cc, "plt.plot([0, 1])\nNone")
		if len(ex.Results) != 1 {
			t.Fatalf("open figure: %d results", len(ex.Results))
		}
		checkPNG(t, "open figure", ex.Results[0])

		ex = codeIn(t, sb, cc, "def inner():\n    raise ValueError('bad value')\ninner()")
		if ex.OK() || ex.Error.EName != "ValueError" || ex.Error.EValue != "bad value" {
			t.Fatalf("exception: %+v", ex)
		}
		if tb := strings.Join(ex.Error.Traceback, "\n"); !strings.Contains(tb, "Traceback") || !strings.Contains(tb, "inner()") {
			t.Errorf("traceback:\n%s", tb)
		}

		// Interrupt a loop; the context keeps its state.
		done := make(chan *sdk.Execution)
		go func() {
			ex, _ := sb.RunCode(t.Context(), "while True:\n    pass", &sdk.CodeOptions{Context: cc})
			done <- ex
		}()
		time.Sleep(500 * time.Millisecond)
		if err := sb.InterruptCode(t.Context(), cc.ID); err != nil {
			t.Fatal(err)
		}
		select {
		case ex := <-done:
			if ex == nil || ex.Error == nil || ex.Error.EName != "KeyboardInterrupt" {
				t.Fatalf("interrupted: %+v", ex)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("the interrupt did not stop the loop")
		}
		if ex := codeIn(t, sb, cc, "total()"); text(ex) != "6" {
			t.Fatalf("after interrupt: %+v", ex)
		}
		start := time.Now()
		ex, err = sb.RunCode(t.Context(), "import time\ntime.sleep(60)", &sdk.CodeOptions{Context: cc, Timeout: time.Second})
		if err != nil || ex.Error == nil || ex.Error.EName != "TimeoutError" || time.Since(start) > 10*time.Second {
			t.Fatalf("timeout: %+v, %v after %v", ex, err, time.Since(start))
		}
		if ex := codeIn(t, sb, cc, "total()"); text(ex) != "6" {
			t.Fatalf("after timeout: %+v", ex)
		}
	})

	t.Run("javascript", func(t *testing.T) {
		cc, err := sb.CreateCodeContext(t.Context(), sdk.LanguageJavaScript, "")
		if err != nil {
			t.Fatal(err)
		}
		codeIn(t, sb, cc, "const path = require('path')\nlet n = 40\nfunction add(a) { return n + a }\nconsole.log('ready')")
		ex := codeIn(t, sb, cc, "add(2)")
		if text(ex) != "42" {
			t.Fatalf("state: %+v", ex)
		}
		ex = codeIn(t, sb, cc, "const p = await Promise.resolve(path.join('a', 'b')); p")
		if text(ex) != "'a/b'" {
			t.Fatalf("await: %+v", ex)
		}
		ex = codeIn(t, sb, cc, "null.x")
		if ex.OK() || ex.Error.EName != "TypeError" || len(ex.Error.Traceback) == 0 {
			t.Fatalf("error: %+v", ex)
		}
		done := make(chan *sdk.Execution)
		go func() {
			ex, _ := sb.RunCode(t.Context(), "while (true) {}", &sdk.CodeOptions{Context: cc})
			done <- ex
		}()
		time.Sleep(500 * time.Millisecond)
		if err := sb.InterruptCode(t.Context(), cc.ID); err != nil {
			t.Fatal(err)
		}
		select {
		case ex := <-done:
			if ex == nil || ex.Error == nil {
				t.Fatalf("interrupted: %+v", ex)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("the interrupt did not stop the loop")
		}
		if ex := codeIn(t, sb, cc, "add(1)"); text(ex) != "41" {
			t.Fatalf("after interrupt: %+v", ex)
		}
	})

	t.Run("bash", func(t *testing.T) {
		cc, err := sb.CreateCodeContext(t.Context(), sdk.LanguageBash, "")
		if err != nil {
			t.Fatal(err)
		}
		codeIn(t, sb, cc, "greeting=hello; cd /etc")
		if ex := codeIn(t, sb, cc, "echo $greeting; pwd"); ex.Stdout != "hello\n/etc\n" {
			t.Fatalf("bash state: %q", ex.Stdout)
		}
		if ex := codeIn(t, sb, cc, "false"); ex.OK() || ex.ExitCode != 1 {
			t.Fatalf("bash failure: %+v", ex)
		}
	})

	t.Run("isolated", func(t *testing.T) {
		a, err := sb.CreateCodeContext(t.Context(), sdk.LanguagePython, "")
		if err != nil {
			t.Fatal(err)
		}
		b, err := sb.CreateCodeContext(t.Context(), sdk.LanguagePython, "")
		if err != nil {
			t.Fatal(err)
		}
		codeIn(t, sb, a, "secret = 'a'")
		if ex := codeIn(t, sb, b, "secret"); ex.OK() || ex.Error.EName != "NameError" {
			t.Fatalf("context b sees a's variable: %+v", ex)
		}
		if err := sb.DeleteCodeContext(t.Context(), a.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.RunCode(t.Context(), "1", &sdk.CodeOptions{Context: a}); !isStatus(err, 404) {
			t.Fatalf("run in a deleted context: %v", err)
		}
	})

	t.Run("parallel", func(t *testing.T) {
		const n = 10
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				cc, err := sb.CreateCodeContext(t.Context(), sdk.LanguagePython, "")
				if err != nil {
					t.Error(err)
					return
				}
				defer sb.DeleteCodeContext(t.Context(), cc.ID)
				ex, err := sb.RunCode(t.Context(), fmt.Sprintf("import time\nmine = %d\ntime.sleep(0.5)\nmine * 10", i), &sdk.CodeOptions{Context: cc})
				if err != nil || text(ex) != fmt.Sprint(i*10) {
					t.Errorf("context %d: %+v, %v", i, ex, err)
				}
			})
		}
		wg.Wait()
	})

	t.Run("bad input", func(t *testing.T) {
		_, err := sb.RunCode(t.Context(), "1", &sdk.CodeOptions{Context: &api.CodeContext{ID: "0123456789abcdef0123456789abcdef", Language: "python"}})
		if !isStatus(err, 404) {
			t.Errorf("unknown context: %v", err)
		}
		_, err = sb.RunCode(t.Context(), "", nil)
		if !isStatus(err, 400) {
			t.Errorf("empty code: %v", err)
		}
		_, err = sb.CreateCodeContext(t.Context(), "cobol", "")
		if !isStatus(err, 400) || !strings.Contains(err.Error(), "javascript") {
			t.Errorf("unknown language: %v", err)
		}
		_, err = sb.RunCode(t.Context(), "1", &sdk.CodeOptions{Context: &api.CodeContext{Language: "cobol"}})
		if !isStatus(err, 400) {
			t.Errorf("unknown language run: %v", err)
		}
	})
}

func isStatus(err error, status int) bool {
	var ae *sdk.APIError
	return errors.As(err, &ae) && ae.StatusCode == status
}
