package api

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// Event types of execd's streaming responses (POST /command, /code and
// /session/{id}/run).
const (
	EventInit           = "init"
	EventPing           = "ping"
	EventStdout         = "stdout"
	EventStderr         = "stderr"
	EventExecutionCount = "execution_count"
	EventResult         = "result"
	EventStatus         = "status"
	EventError          = "error"
	EventComplete       = "execution_complete"
)

// ErrorNameCommand is the ename of a command that failed or could not
// start; its evalue is the exit code in decimal, "-1" after a signal, or the
// start error's text.
const ErrorNameCommand = "CommandExecError"

// Event is one event of an execd stream. On the wire each event is one
// compact JSON object followed by a blank line ("\n\n"). Every field but
// Type is omitted when empty, except Timestamp, which is always sent.
type Event struct {
	Type           string `json:"type"`
	Text           string `json:"text,omitempty"`
	ExecutionCount int    `json:"execution_count,omitempty"`
	// ExecutionTime is in milliseconds.
	ExecutionTime int64 `json:"execution_time,omitempty"`
	// Timestamp is in Unix milliseconds.
	Timestamp int64           `json:"timestamp"`
	Results   map[string]any  `json:"results,omitempty"`
	Error     *ExecutionError `json:"error,omitempty"`
}

// ExecutionError is the payload of an "error" event.
type ExecutionError struct {
	EName     string   `json:"ename"`
	EValue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// AppendFrame appends e's wire form, JSON plus the "\n\n" separator, to b.
// It produces the same bytes as encoding/json for the same event, but
// without reflection, because output events are the hot path of streaming.
func (e *Event) AppendFrame(b []byte) []byte {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, e.Type)
	if e.Text != "" {
		b = append(b, `,"text":`...)
		b = appendJSONString(b, e.Text)
	}
	if e.ExecutionCount != 0 {
		b = append(b, `,"execution_count":`...)
		b = strconv.AppendInt(b, int64(e.ExecutionCount), 10)
	}
	if e.ExecutionTime != 0 {
		b = append(b, `,"execution_time":`...)
		b = strconv.AppendInt(b, e.ExecutionTime, 10)
	}
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, e.Timestamp, 10)
	if len(e.Results) > 0 {
		b = append(b, `,"results":`...)
		b = appendJSONValue(b, e.Results)
	}
	if e.Error != nil {
		b = append(b, `,"error":`...)
		b = appendJSONValue(b, e.Error)
	}
	return append(b, "}\n\n"...)
}

// appendJSONValue encodes the rare, structured parts of an event. A value
// that cannot be encoded becomes null rather than a broken frame.
func appendJSONValue(b []byte, v any) []byte {
	j, err := json.Marshal(v)
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, j...)
}

const hexDigits = "0123456789abcdef"

// plainASCII marks the ASCII bytes that appear in a JSON string as they
// are; the others are escaped as encoding/json escapes them.
var plainASCII = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendJSONString appends s as a JSON string the way encoding/json does:
// invalid UTF-8 becomes U+FFFD, and <, >, &, U+2028 and U+2029 are escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if plainASCII[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
