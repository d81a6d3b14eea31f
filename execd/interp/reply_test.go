package interp

import (
	"bytes"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

func TestParseReply(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{`{"type":"ready","language":"python","version":"3.11.2"}`, true},
		{`{"type":"result","id":"1","execution_count":1,"data":{"text/plain":"2"}}`, true},
		{`{"type":"display","id":"1","data":{"image/png":"iVBO"}}`, true},
		{`{"type":"error","id":"1","ename":"E","evalue":"v","traceback":["a"]}`, true},
		{`{"type":"done","id":"1","execution_count":1}`, true},
		{`{"type":"result","id":"1","data":{}}`, false},
		{`{"type":"display","id":"1"}`, false},
		{`{"type":"done"}`, false},
		{`{"type":"bogus","id":"1"}`, false},
		{`not json`, false},
		{`{"type":"result","id":"1","data":"text"}`, false},
	} {
		_, err := parseReply([]byte(tc.line))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v", tc.line, err)
		}
	}
}

func TestReplyEvents(t *testing.T) {
	m, _ := parseReply([]byte(`{"type":"result","id":"1","execution_count":3,"data":{"text/plain":"4","text/html":"<b>4</b>","application/json":{"a":1}}}`))
	evs := m.events(5)
	if len(evs) != 2 || evs[0].Type != api.EventExecutionCount || evs[0].ExecutionCount != 3 || evs[1].Type != api.EventResult {
		t.Fatalf("events %+v", evs)
	}
	if r := evs[1].Results; r["text"] != "4" || r["text/html"] != "<b>4</b>" || r["text/plain"] != nil || r["application/json"] == nil {
		t.Errorf("results %v", r)
	}
	m, _ = parseReply([]byte(`{"type":"error","id":"1","ename":"E","evalue":"v"}`))
	evs = m.events(5)
	if len(evs) != 2 || evs[0].Type != api.EventStatus || evs[0].Text != "error" || evs[1].Error.EName != "E" || evs[1].Error.Traceback == nil {
		t.Errorf("error events %+v", evs)
	}
	m, _ = parseReply([]byte(`{"type":"done","id":"1"}`))
	if evs := m.events(5); len(evs) != 0 {
		t.Errorf("done gave events %+v", evs)
	}
}

func TestLineSplitter(t *testing.T) {
	var got []string
	var errs int
	s := lineSplitter{max: 8}
	feed := func(chunks ...string) {
		for _, c := range chunks {
			s.write([]byte(c), func(l []byte) { got = append(got, string(l)) }, func(error) { errs++ })
		}
	}
	feed("ab", "c\nde", "f\n", "\n")
	feed("0123456789", "abc\nok\n") // too long in pieces: dropped whole
	feed("0123456789\nafter\n")     // too long in one chunk
	feed("12345678\n")              // exactly max
	if strings.Join(got, "|") != "abc|def||ok|after|12345678" || errs != 2 {
		t.Errorf("lines %q, %d errors", got, errs)
	}
}

// FuzzReplies feeds arbitrary bytes, cut at arbitrary points, through the
// line splitter and the reply parser: nothing panics, no line is longer
// than the limit, and every accepted reply gives well-formed events.
func FuzzReplies(f *testing.F) {
	f.Add([]byte(`{"type":"result","id":"1","execution_count":1,"data":{"text/plain":"2"}}`+"\n"+`{"type":"done","id":"1"}`+"\n"), uint8(7))
	f.Add([]byte(`{"type":"error","id":"x","traceback":null}`+"\n\n\n"), uint8(1))
	f.Add([]byte(`{"type":"display","id":"1","data":{"text":"a","text/plain":"b"}}`+"\n"), uint8(200))
	f.Fuzz(func(t *testing.T, data []byte, cut uint8) {
		s := lineSplitter{max: 256}
		var lines int
		emit := func(line []byte) {
			lines++
			if len(line) > 256 || bytes.IndexByte(line, '\n') >= 0 {
				t.Fatalf("line of %d bytes with a newline or over the limit", len(line))
			}
			m, err := parseReply(line)
			if err != nil {
				return
			}
			for _, ev := range m.events(1) {
				if ev.Type == "" || (ev.Type == api.EventResult && len(ev.Results) == 0) || (ev.Type == api.EventError && ev.Error == nil) {
					t.Fatalf("malformed event %+v from %q", ev, line)
				}
				frame := ev.AppendFrame(nil)
				if _, err := api.NewEventDecoder(bytes.NewReader(frame)).Next(); err != nil {
					t.Fatalf("event %q does not decode: %v", frame, err)
				}
			}
		}
		step := int(cut)%17 + 1
		for i := 0; i < len(data); i += step {
			s.write(data[i:min(i+step, len(data))], emit, func(error) {})
		}
	})
}
