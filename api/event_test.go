package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestAppendFrameMatchesEncodingJSON(t *testing.T) {
	events := []Event{
		{Type: EventInit, Text: "5d8c0a9e2f4b4d1c9a7e3b6f1c2d4e5f", Timestamp: 1767607200000},
		{Type: EventPing, Text: "pong", Timestamp: 1},
		{Type: EventStdout, Text: "\n", Timestamp: 2},
		{Type: EventStdout, Text: "tab\there \"quoted\" back\\slash <b>&amp;</b> \x00\x1f\x7f", Timestamp: 3},
		{Type: EventStderr, Text: "invalid \xff\xfe utf8 and \u2028\u2029 and émoji 🎉", Timestamp: 4},
		{Type: EventExecutionCount, ExecutionCount: 4, Timestamp: 5},
		{Type: EventResult, Timestamp: 6, Results: map[string]any{"text": "4", "application/json": map[string]any{"a": 1}}},
		{Type: EventError, Timestamp: 7, Error: &ExecutionError{EName: ErrorNameCommand, EValue: "3", Traceback: []string{"exit status 3"}}},
		{Type: EventError, Timestamp: 8, Error: &ExecutionError{EName: "X", EValue: "y"}},
		{Type: EventComplete, ExecutionTime: 12, Timestamp: 9},
	}
	for _, e := range events {
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, "\n\n"...)
		if got := e.AppendFrame(nil); !bytes.Equal(got, want) {
			t.Errorf("AppendFrame(%+v)\n got %s\nwant %s", e, got, want)
		}
	}
}

func FuzzAppendFrame(f *testing.F) {
	f.Add("hello", int64(1))
	f.Add("\xff\u2028<>&\"\\\n", int64(-5))
	f.Fuzz(func(t *testing.T, text string, ts int64) {
		e := Event{Type: EventStdout, Text: text, Timestamp: ts}
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		got := e.AppendFrame(nil)
		if !bytes.Equal(got[:len(got)-2], want) {
			t.Fatalf("AppendFrame(%q)\n got %s\nwant %s", text, got, want)
		}
	})
}

func BenchmarkAppendFrame(b *testing.B) {
	e := Event{Type: EventStdout, Text: "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor", Timestamp: 1767607200000}
	buf := make([]byte, 0, 256)
	b.SetBytes(int64(len(e.Text)))
	b.ReportAllocs()
	for b.Loop() {
		buf = e.AppendFrame(buf[:0])
	}
}

func TestCredentialSourceHidesItsValue(t *testing.T) {
	req := CredentialVaultCreateRequest{Credentials: []Credential{{Name: "k", Source: CredentialSource{Type: "inline", Value: "sk-secret"}}}}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		if got := fmt.Sprintf(f, req); strings.Contains(got, "sk-secret") {
			t.Errorf("%s prints the value: %s", f, got)
		}
	}
}
