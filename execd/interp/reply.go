package interp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// maxReplyLine is the longest reply line a driver may write: a big PNG in
// base64 fits. A longer line is dropped whole. It bounds what execd holds
// for one reply; decoding and sending it take about twice as much again,
// so a context's rich output costs execd at most some 50 MiB at a time.
const maxReplyLine = 16 << 20

// Reply types, driver → execd.
const (
	replyReady   = "ready"
	replyResult  = "result"
	replyDisplay = "display"
	replyError   = "error"
	replyDone    = "done"
	// replyStarted: the driver began the run and can be interrupted.
	replyStarted = "started"
	// replyOverflow is not sent by drivers: execd makes it when a reply
	// line was too long to keep.
	replyOverflow = "overflow"
)

// reply is one message a driver writes on fd 4.
type reply struct {
	Type           string         `json:"type"`
	ID             string         `json:"id"`
	ExecutionCount int            `json:"execution_count"`
	Data           map[string]any `json:"data"`
	EName          string         `json:"ename"`
	EValue         string         `json:"evalue"`
	Traceback      []string       `json:"traceback"`
	Language       string         `json:"language"`
	Version        string         `json:"version"`
}

// parseReply decodes and checks one reply line. Unknown types, run
// messages without an id and result or display messages without data are
// errors.
func parseReply(line []byte) (reply, error) {
	var m reply
	if err := json.Unmarshal(line, &m); err != nil {
		return reply{}, fmt.Errorf("decode driver reply: %w", err)
	}
	switch m.Type {
	case replyReady:
		return m, nil
	case replyResult, replyDisplay:
		if len(m.Data) == 0 {
			return reply{}, fmt.Errorf("driver %s reply without data", m.Type)
		}
	case replyError, replyDone, replyStarted:
	default:
		return reply{}, fmt.Errorf("unknown driver reply type %q", m.Type)
	}
	if m.ID == "" {
		return reply{}, fmt.Errorf("driver %s reply without id", m.Type)
	}
	return m, nil
}

// events returns the stream events a run message stands for, stamped with
// now (Unix ms): result → execution_count and result; display → result;
// error → status "error" and error. done has none: the run's end is the
// caller's to send.
func (m *reply) events(now int64) []api.Event {
	switch m.Type {
	case replyResult:
		return []api.Event{
			{Type: api.EventExecutionCount, ExecutionCount: m.ExecutionCount, Timestamp: now},
			{Type: api.EventResult, Results: results(m.Data), Timestamp: now},
		}
	case replyDisplay:
		return []api.Event{{Type: api.EventResult, Results: results(m.Data), Timestamp: now}}
	case replyError:
		tb := m.Traceback
		if tb == nil {
			tb = []string{}
		}
		return []api.Event{
			{Type: api.EventStatus, Text: "error", Timestamp: now},
			{Type: api.EventError, Error: &api.ExecutionError{EName: m.EName, EValue: m.EValue, Traceback: tb}, Timestamp: now},
		}
	}
	return nil
}

// results renames text/plain to text, as the clients expect.
func results(data map[string]any) map[string]any {
	out := make(map[string]any, len(data))
	for k, v := range data {
		if k == "text/plain" {
			k = "text"
		} else if k == "text" {
			if _, ok := data["text/plain"]; ok {
				continue
			}
		}
		out[k] = v
	}
	return out
}

// errLineTooLong reports a reply line over maxReplyLine.
var errLineTooLong = errors.New("driver reply line too long")

// lineSplitter cuts a byte stream into lines of at most max bytes. A line
// over the limit is reported once and skipped to its end.
type lineSplitter struct {
	max        int
	buf        []byte
	discarding bool
}

// write feeds b; fn gets every complete line (without its "\n", valid only
// during the call) and onErr every line too long.
func (s *lineSplitter) write(b []byte, fn func(line []byte), onErr func(error)) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if !s.discarding {
				if len(s.buf)+len(b) > s.max {
					s.buf, s.discarding = s.buf[:0], true
					onErr(errLineTooLong)
				} else {
					s.buf = append(s.buf, b...)
				}
			}
			return
		}
		switch {
		case s.discarding:
			s.discarding = false
		case len(s.buf)+i > s.max:
			onErr(errLineTooLong)
		case len(s.buf) == 0:
			fn(b[:i])
		default:
			s.buf = append(s.buf, b[:i]...)
			fn(s.buf)
		}
		s.buf = s.buf[:0]
		if cap(s.buf) > 1<<20 {
			s.buf = nil // do not keep a big PNG's buffer for the context's life
		}
		b = b[i+1:]
	}
}

// nowMilli is the timestamp of events, in Unix ms.
func nowMilli() int64 { return time.Now().UnixMilli() }
