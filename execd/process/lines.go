package process

import (
	"bytes"
	"unicode/utf8"
)

// MaxLine is the longest line Lines hands over in one piece: a longer line
// is cut at a character boundary into pieces of at most this size, each
// handed over as soon as it is complete, so no more than this much of a
// line is ever held however long the line grows. Lines up to this size
// reach clients whole, as they did before pieces (a client adds a line
// end to every event). With JSON escaping (at worst 6 bytes a byte), an
// event of one piece stays within the 4 MiB line limit of the strictest
// client.
const MaxLine = 512 << 10

// Lines splits output into lines as execd streams them: "\n", "\r" and
// "\r\n" each end a line, and the terminator is dropped. It keeps the tail
// of a line until its end arrives or Flush is called.
type Lines struct {
	partial []byte
	// lastCR records a chunk that ended in '\r', so a '\n' that starts the
	// next chunk is taken as the rest of "\r\n".
	lastCR bool
}

// Write splits p and calls emit for each complete line. The slice passed
// to emit is only valid during the call.
func (l *Lines) Write(p []byte, emit func(line []byte)) {
	if l.lastCR && len(p) > 0 && p[0] == '\n' {
		p = p[1:]
	}
	l.lastCR = false
	for len(p) > 0 {
		i := indexEOL(p)
		if i < 0 {
			l.partial = append(l.partial, p...)
			for len(l.partial) >= MaxLine {
				cut := cutPoint(l.partial[:MaxLine])
				emit(l.partial[:cut])
				l.partial = append(l.partial[:0], l.partial[cut:]...)
			}
			return
		}
		if len(l.partial) > 0 {
			l.partial = append(l.partial, p[:i]...)
			emitCut(l.partial, emit)
			l.partial = l.partial[:0]
		} else {
			emitCut(p[:i], emit)
		}
		if p[i] == '\r' {
			if i+1 == len(p) {
				l.lastCR = true
			} else if p[i+1] == '\n' {
				i++
			}
		}
		p = p[i+1:]
	}
	if cap(l.partial) > 4*MaxLine {
		l.partial = nil
	}
}

// Flush emits the pending partial line, if any. A character cut in half is
// kept back for the next Write, unless final is set.
func (l *Lines) Flush(final bool, emit func(line []byte)) {
	if len(l.partial) == 0 {
		return
	}
	cut := len(l.partial)
	if !final {
		cut = cutPoint(l.partial)
		if cut == 0 {
			return
		}
	}
	emit(l.partial[:cut])
	l.partial = append(l.partial[:0], l.partial[cut:]...)
}

// emitCut emits a whole line, in pieces of at most MaxLine cut at
// character boundaries when it is longer.
func emitCut(line []byte, emit func(line []byte)) {
	for len(line) > MaxLine {
		cut := cutPoint(line[:MaxLine])
		emit(line[:cut])
		line = line[cut:]
	}
	emit(line)
}

func indexEOL(p []byte) int {
	i := bytes.IndexByte(p, '\n')
	if i < 0 {
		return bytes.IndexByte(p, '\r')
	}
	if j := bytes.IndexByte(p[:i], '\r'); j >= 0 {
		return j
	}
	return i
}

// cutPoint returns the largest n <= len(b) such that b[:n] does not end in
// the middle of a UTF-8 sequence.
func cutPoint(b []byte) int {
	n := len(b)
	for i := 1; i < utf8.UTFMax && i <= n; i++ {
		c := b[n-i]
		if c < utf8.RuneSelf {
			return n
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[n-i:]) {
				return n - i
			}
			return n
		}
	}
	return n
}
