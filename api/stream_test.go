package api

import (
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestEventDecoder(t *testing.T) {
	stream := `{"type":"init","text":"abc","timestamp":1}

data: {"type":"stdout","text":"hi","timestamp":2}
: a comment
event: message
id: 7
retry: 10
{"type":"stderr","text":"tab\t\"q\" \u00e9 \ud83c\udf89","timestamp":3}

{"type":"error","timestamp":4,"error":{"ename":"CommandExecError","evalue":"3","traceback":["exit status 3"]}}

{"code":"RUNTIME_ERROR","message":"session is busy"}
`
	dec := NewEventDecoder(strings.NewReader(stream))
	want := []Event{
		{Type: EventInit, Text: "abc", Timestamp: 1},
		{Type: EventStdout, Text: "hi", Timestamp: 2},
		{Type: EventStderr, Text: "tab\t\"q\" é 🎉", Timestamp: 3},
		{Type: EventError, Timestamp: 4, Error: &ExecutionError{EName: "CommandExecError", EValue: "3", Traceback: []string{"exit status 3"}}},
	}
	for i, w := range want {
		got, err := dec.Next()
		if err != nil || !reflect.DeepEqual(got, w) {
			t.Fatalf("event %d = %+v, %v; want %+v", i, got, err, w)
		}
	}
	_, err := dec.Next()
	var se *StreamError
	if !errors.As(err, &se) || se.Code != "RUNTIME_ERROR" || se.Message != "session is busy" {
		t.Fatalf("bare error line: %v", err)
	}
	if _, err := dec.Next(); err != io.EOF {
		t.Fatalf("end: %v, want EOF", err)
	}
}

// FuzzDecodeFast checks the fast path against encoding/json: whatever it
// accepts, encoding/json must decode to the same event.
func FuzzDecodeFast(f *testing.F) {
	for _, s := range []string{
		`{"type":"stdout","text":"hello","timestamp":1767607200000}`,
		`{"type":"ping","text":"pong","timestamp":0}`,
		`{"type":"stdout","text":"a\"b\\c\n\u00e9\ud83c\udf89\ud800","timestamp":-5}`,
		`{"type":"x","timestamp":01}`,
		`{"type":"stdout","text":"\xff","timestamp":1}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		got, ok := decodeFast([]byte(line))
		if !ok {
			return
		}
		var want Event
		if err := json.Unmarshal([]byte(line), &want); err != nil {
			t.Fatalf("fast path accepted %q, which encoding/json rejects: %v", line, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decode %q: fast %+v, encoding/json %+v", line, got, want)
		}
	})
}

func BenchmarkEventDecoder(b *testing.B) {
	ev := Event{Type: EventStdout, Text: strings.Repeat("x", 999), Timestamp: 1767607200000}
	frame := ev.AppendFrame(nil)
	data := []byte(strings.Repeat(string(frame), 1000))
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		dec := NewEventDecoder(strings.NewReader(string(data)))
		for {
			if _, err := dec.Next(); err != nil {
				break
			}
		}
	}
}
