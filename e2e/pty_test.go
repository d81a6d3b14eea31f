package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/opensandbox/opensandbox/api"
)

func TestTerminalInContainer(t *testing.T) {
	c := startContainer(t, pythonImage, nil, "sleep", "infinity")
	var sess api.PTYSession
	c.call("POST", "/pty", api.CreatePTYRequest{Cwd: "/tmp"}, 201, &sess)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	url := strings.Replace(c.base, "http://", "ws://", 1) + "/pty/" + sess.SessionID + "/ws"
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{api.HeaderExecdToken: {c.token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()

	var screen strings.Builder
	until := func(want string) {
		t.Helper()
		for !strings.Contains(screen.String(), want) {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				t.Fatalf("waiting for %q: %v; screen %q", want, err, screen.String())
			}
			if typ == websocket.MessageBinary && len(data) > 0 && data[0] == api.PTYFrameStdout {
				screen.Write(data[1:])
			} else if typ == websocket.MessageText {
				screen.Write(data)
			}
		}
	}
	send := func(s string) {
		t.Helper()
		if err := conn.Write(ctx, websocket.MessageBinary, append([]byte{api.PTYFrameStdin}, s...)); err != nil {
			t.Fatal(err)
		}
	}
	until(`"type":"connected"`)
	send("echo $((6*7)) in $PWD\n")
	until("42 in /tmp")
	conn.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","cols":100,"rows":30}`))
	send("stty size\n")
	until("30 100")
	send("exit 7\n")
	until(`"type":"exit","exit_code":7`)
}
