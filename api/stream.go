package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxEventLine is the longest event line an EventDecoder accepts.
const MaxEventLine = 64 << 20

// StreamError is a bare {code,message} line inside a stream: the way the
// reference daemon reports failures after the first event.
type StreamError struct {
	Code    string
	Message string
}

func (e *StreamError) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// EventDecoder reads the events of an execd stream. It accepts what every
// OpenSandbox client accepts: bare JSON lines separated by blank lines, and
// SSE-style "data:" lines; comment, "event:", "id:" and "retry:" lines are
// skipped.
type EventDecoder struct {
	r *bufio.Reader
}

// NewEventDecoder returns a decoder reading from r.
func NewEventDecoder(r io.Reader) *EventDecoder {
	return &EventDecoder{r: bufio.NewReaderSize(r, 64<<10)}
}

// Next returns the next event. It returns io.EOF at the clean end of the
// stream, and a *StreamError for a bare error line.
func (d *EventDecoder) Next() (Event, error) {
	for {
		line, err := d.readLine()
		if len(line) == 0 {
			if err != nil {
				return Event{}, err
			}
			continue
		}
		if line[0] == ':' || bytes.HasPrefix(line, []byte("event:")) ||
			bytes.HasPrefix(line, []byte("id:")) || bytes.HasPrefix(line, []byte("retry:")) {
			continue
		}
		if rest, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			line = bytes.TrimLeft(rest, " ")
		}
		if ev, ok := decodeFast(line); ok && ev.Type != "" {
			return ev, nil
		}
		var ev struct {
			Event
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if jerr := json.Unmarshal(line, &ev); jerr != nil {
			return Event{}, fmt.Errorf("decode event %.120q: %w", line, jerr)
		}
		if ev.Type == "" {
			if ev.Code != "" {
				return Event{}, &StreamError{Code: ev.Code, Message: ev.Message}
			}
			return Event{}, fmt.Errorf("event without type: %.120q", line)
		}
		return ev.Event, nil
	}
}

var errLineTooLong = errors.New("event line longer than MaxEventLine")

func (d *EventDecoder) readLine() ([]byte, error) {
	line, err := d.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		buf := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if len(buf) > MaxEventLine {
				return nil, errLineTooLong
			}
			line, err = d.r.ReadSlice('\n')
			buf = append(buf, line...)
		}
		line = buf
	}
	if err == io.EOF && len(line) > 0 {
		err = nil
	}
	return bytes.TrimRight(line, "\r\n"), err
}
