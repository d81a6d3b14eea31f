package e2e

import (
	"strconv"
	"strings"
	"testing"
)

// TestOSBFileCatLines reads windows of lines of a file in a Docker
// sandbox through osb file cat --offset --limit: line endings kept byte
// for byte, the ends of the file, and refusals.
func TestOSBFileCatLines(t *testing.T) {
	s := startServer(t, serverOptions{})
	id := createRunning(t, s)
	s.osb("file", "write", id, "/tmp/l.txt", "-c", "one\ntwo\r\nthree\nfour").ok(t)
	// 3,000 lines made inside the sandbox, so the window is read there.
	s.execd(id).mustRun("seq 1 3000 > /tmp/seq.txt")

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--offset", "2", "--limit", "2"}, "two\r\nthree\n"},
		{[]string{"--offset", "3"}, "three\nfour"},
		{[]string{"--limit", "1"}, "one\n"},
		{[]string{"--offset", "4", "--limit", "9"}, "four"},
		{[]string{"--offset", "5"}, ""},
	} {
		args := append([]string{"file", "cat", id, "/tmp/l.txt"}, tt.args...)
		s.osb(args...).exits(t, 0, tt.want, "")
	}
	var want strings.Builder
	for i := 1500; i < 1503; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	s.osb("file", "cat", id, "/tmp/seq.txt", "--offset", "1500", "--limit", "3").exits(t, 0, want.String(), "")
	// Without the flags, the whole file as before.
	s.osb("file", "cat", id, "/tmp/l.txt").exits(t, 0, "one\ntwo\r\nthree\nfour", "")

	s.osb("file", "cat", id, "/tmp/l.txt", "--offset", "0").fails(t, 2, "--offset 0")
	s.osb("file", "cat", id, "/tmp/l.txt", "--limit", "-2").fails(t, 2, "--limit -2")
	s.osb("file", "cat", id, "/tmp/l.txt", "--limit", "x").fails(t, 2, "--limit")
	s.osb("file", "cat", id, "/tmp/missing", "--offset", "1").fails(t, 1, "not found")
	s.osb("file", "cat", id, "/tmp", "--limit", "1").fails(t, 1, "is a directory")
}
