package api

import (
	"archive/tar"
	"bytes"
	"strings"
	"time"
)

// ExecdPort is the port execd listens on inside every sandbox.
const ExecdPort = 44772

// Header names used by execd.
const (
	// HeaderExecdToken carries the per-sandbox access token.
	HeaderExecdToken = "X-EXECD-ACCESS-TOKEN"
	// HeaderTailCursor carries the next byte offset of a background
	// command's log.
	HeaderTailCursor = "EXECD-COMMANDS-TAIL-CURSOR"
	// HeaderArchiveContentLength carries, on GET /files/archive with
	// measure=true, the content bytes of the regular files about to be
	// streamed: a hint for progress reports. Not in the reference daemon.
	HeaderArchiveContentLength = "X-Archive-Content-Length"
	// HeaderArchiveError is a trailer of GET /files/archive: set when the
	// stream could not be finished (a file or directory execd cannot
	// read), it says why. The stream then ends inside an entry (see
	// ArchiveIncompleteEntry), so that a reader that ignores trailers
	// fails too rather than take the archive as whole. Not in the
	// reference daemon.
	HeaderArchiveError = "X-Archive-Error"
)

// ArchiveIncompleteName names the entry an archive stream that could not
// be finished ends with (see ArchiveIncompleteEntry).
const ArchiveIncompleteName = "OPENSANDBOX-ARCHIVE-INCOMPLETE"

// ArchiveIncompleteEntry returns what an archive stream that could not be
// finished between two entries ends with: the header of a file
// ArchiveIncompleteName longer than what follows, then the reason in
// readable text, and the end of the stream. Every tar reader (Go's, GNU
// and busybox tar, Python's tarfile) stops there with an unexpected end
// of data; one that extracts leaves the reason in that file. (A stream
// cut inside an entry just ends there, for the same effect.)
func ArchiveIncompleteEntry(reason string) []byte {
	text := "opensandbox: archive incomplete: " + reason + "\n"
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	// The header alone is written here (WriteHeader never fails for a
	// plain USTAR file); the writer is never closed, since the content
	// it announces does not all come.
	tw.WriteHeader(&tar.Header{Name: ArchiveIncompleteName, Mode: 0o644, Typeflag: tar.TypeReg,
		Size: int64(len(text)) + 1<<20, Format: tar.FormatUSTAR})
	return append(b.Bytes(), text...)
}

// Error codes in execd's {code,message} error body.
const (
	CodeInvalidRequestBody  = "INVALID_REQUEST_BODY"
	CodeMissingQuery        = "MISSING_QUERY"
	CodeRuntimeError        = "RUNTIME_ERROR"
	CodeInvalidFile         = "INVALID_FILE"
	CodeInvalidFileContent  = "INVALID_FILE_CONTENT"
	CodeInvalidFileMetadata = "INVALID_FILE_METADATA"
	CodeFileNotFound        = "FILE_NOT_FOUND"
	CodeContextNotFound     = "CONTEXT_NOT_FOUND"
	CodeNotSupported        = "NOT_SUPPORTED"
	CodeUnknown             = "UNKNOWN"
	// CodeAlreadyConnected answers a PTY attach while another client holds
	// the session.
	CodeAlreadyConnected = "ALREADY_CONNECTED"
	// CodeInsufficientStorage answers an upload that the file system
	// cannot hold. Not used by the reference daemon, which answers 500.
	CodeInsufficientStorage = "INSUFFICIENT_STORAGE"
	// CodePermissionDenied answers a request on a file or directory
	// execd may not read or change (403). The reference daemon answers
	// 500 RUNTIME_ERROR.
	CodePermissionDenied = "PERMISSION_DENIED"
	// CodeTooManyContexts answers a code context asked for beyond the
	// sandbox's limit.
	CodeTooManyContexts = "TOO_MANY_CONTEXTS"
	// CodeRequestTooLarge answers a body over the configured limit.
	CodeRequestTooLarge = "REQUEST_TOO_LARGE"
	// CodeEntrypointFailed answers GET ExecdReadyPath (503) when the
	// sandbox's entrypoint could not start. Not in the reference daemon.
	CodeEntrypointFailed = "ENTRYPOINT_FAILED"
)

// ErrorResponse is the error body of execd and the lifecycle server.
type ErrorResponse struct {
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// UnauthorizedResponse is execd's 401 body, which differs from ErrorResponse.
type UnauthorizedResponse struct {
	Error string `json:"error"`
}

// RunCommandRequest is the body of POST /command.
type RunCommandRequest struct {
	Command    string `json:"command"`
	Cwd        string `json:"cwd,omitempty"`
	Background bool   `json:"background,omitempty"`
	// Timeout is in milliseconds; 0 means no limit.
	Timeout int64             `json:"timeout,omitempty"`
	UID     *uint32           `json:"uid,omitempty"`
	GID     *uint32           `json:"gid,omitempty"`
	Envs    map[string]string `json:"envs,omitempty"`
}

// CommandStatus is the body of GET /command/status/{id}.
type CommandStatus struct {
	ID      string `json:"id"`
	Content string `json:"content,omitempty"`
	Running bool   `json:"running"`
	// ExitCode is absent while running, -1 after a signal, 255 when the
	// command could not start.
	ExitCode   *int       `json:"exit_code,omitempty"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// EntrypointCommandID is the command id under which execd serves the
// entrypoint's status: GET /command/status/entrypoint.
const EntrypointCommandID = "entrypoint"

// ExecdReadyPath is execd's readiness route, the one route served without
// the access token: GET or HEAD answers 200 once execd serves, and 503
// with code CodeEntrypointFailed when the sandbox's entrypoint could not
// start. It tells nothing more; the entrypoint's status, with its error,
// is GET /command/status/entrypoint, behind the token. For users and
// checks from outside the sandbox (a load balancer, a monitor).
const ExecdReadyPath = "/ready"

// ExitCodeStartFailure is the exit code execd records for a command that
// could not start.
const ExitCodeStartFailure = 255

// StartFailed reports whether the command could not start at all (its
// executable missing, not executable, not a valid executable), as opposed
// to one that ran and exited: execd records that as exit code 255 with the
// start error, and a process that ran as "exit status N" or "signal: S".
func (s *CommandStatus) StartFailed() bool {
	return !s.Running && s.ExitCode != nil && *s.ExitCode == ExitCodeStartFailure && s.Error != "" &&
		!strings.HasPrefix(s.Error, "exit status ") && !strings.HasPrefix(s.Error, "signal: ")
}

// CreateSessionRequest is the optional body of POST /session.
type CreateSessionRequest struct {
	Cwd string `json:"cwd,omitempty"`
}

// CreateSessionResponse is the body answered by POST /session.
type CreateSessionResponse struct {
	SessionID string `json:"session_id"`
}

// RunInSessionRequest is the body of POST /session/{id}/run.
type RunInSessionRequest struct {
	Command string `json:"command"`
	Cwd     string `json:"cwd,omitempty"`
	// Timeout is in milliseconds; 0 means the daemon's cap.
	Timeout int64 `json:"timeout,omitempty"`
}

// CreatePTYRequest is the optional body of POST /pty.
type CreatePTYRequest struct {
	Cwd     string `json:"cwd,omitempty"`
	Command string `json:"command,omitempty"`
}

// PTYSession is the body answered by POST /pty (201).
type PTYSession struct {
	SessionID string `json:"session_id"`
}

// PTYStatus is the body of GET /pty/{id}.
type PTYStatus struct {
	SessionID string `json:"session_id"`
	Running   bool   `json:"running"`
	// OutputOffset is the number of bytes the session has produced so far;
	// pass it as since= to reattach without repeated output.
	OutputOffset int64 `json:"output_offset"`
}

// PTY WebSocket binary frame kinds: the first byte of each binary message.
const (
	PTYFrameStdin  byte = 0x00
	PTYFrameStdout byte = 0x01
	PTYFrameStderr byte = 0x02
	PTYFrameReplay byte = 0x03
)

// PTYMessage is a JSON text message on the PTY WebSocket, in either
// direction. Which fields are set depends on Type.
type PTYMessage struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id,omitempty"`
	Mode      string `json:"mode,omitempty"`
	Data      string `json:"data,omitempty"`
	Cols      int    `json:"cols,omitempty"`
	Rows      int    `json:"rows,omitempty"`
	Signal    string `json:"signal,omitempty"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	Error     string `json:"error,omitempty"`
	Code      string `json:"code,omitempty"`
}

// FileInfo describes one file system entry.
type FileInfo struct {
	Path string `json:"path"`
	// Type is "file", "directory", "symlink" or "other".
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modified_at"`
	CreatedAt  time.Time `json:"created_at"`
	Owner      string    `json:"owner"`
	Group      string    `json:"group"`
	// Mode holds the permission bits as octal digits read as a decimal
	// number: 0o755 travels as 755.
	Mode int `json:"mode"`
}

// Permission is a requested owner, group and mode. Mode uses the same
// octal-digits encoding as FileInfo.Mode; 0 leaves the mode alone.
type Permission struct {
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
	Mode  int    `json:"mode,omitempty"`
}

// FileMetadata is the JSON of an upload's metadata part.
type FileMetadata struct {
	Path  string `json:"path"`
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
	Mode  int    `json:"mode,omitempty"`
}

// RenameFileItem is one entry of POST /files/mv.
type RenameFileItem struct {
	Src  string `json:"src"`
	Dest string `json:"dest"`
}

// ReplaceFileContentItem is one entry of POST /files/replace.
type ReplaceFileContentItem struct {
	Old string `json:"old"`
	New string `json:"new"`
}

// ReplaceResult is one entry of the verbose answer of POST /files/replace.
type ReplaceResult struct {
	ReplacedCount int `json:"replacedCount"`
}

// Metrics is the body of GET /metrics and each line of /metrics/watch.
type Metrics struct {
	CPUCount    float64 `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotalMiB float64 `json:"mem_total_mib"`
	MemUsedMiB  float64 `json:"mem_used_mib"`
	// Timestamp is in Unix milliseconds.
	Timestamp int64 `json:"timestamp"`
}

// ArchiveStats answers POST /files/archive: what the extracted stream
// held. Not in the reference daemon.
type ArchiveStats struct {
	Files   int   `json:"files"`   // regular files written
	Dirs    int   `json:"dirs"`    // directories created or found
	Links   int   `json:"links"`   // symbolic and hard links written
	Skipped int   `json:"skipped"` // entries left out: FIFOs and devices
	Bytes   int64 `json:"bytes"`   // content bytes of the regular files
}

// ClaimRequest is the body of POST /claim, which hands a pre-started
// sandbox of a warm pool to its user: the lifecycle server sends it once,
// with the pool's token, right after the claim. The Docker runtime also
// sends it, with the sandbox's own token as both header and Token, to
// start the held entrypoint of a sandbox whose disk it measures, once it
// has measured it. Not in the reference daemon.
type ClaimRequest struct {
	// Token replaces the access token; the old one stops working.
	Token string `json:"token"`
	// Env is added to the environment of every process started after the
	// claim, the entrypoint included.
	Env map[string]string `json:"env,omitempty"`
	// Entrypoint, when set, is started as the sandbox's main process.
	Entrypoint []string `json:"entrypoint,omitempty"`
}

// CodeContext is a stateful interpreter session of the /code routes.
type CodeContext struct {
	ID       string `json:"id,omitempty"`
	Language string `json:"language"`
	// Cwd is the context's working directory; sent on create, echoed by
	// the reference daemon in the create answer only.
	Cwd string `json:"cwd,omitempty"`
}

// RunCodeRequest is the body of POST /code. A context with a language
// and an id runs in that context; with a language only, in the
// language's default context.
type RunCodeRequest struct {
	Code    string       `json:"code"`
	Context *CodeContext `json:"context,omitempty"`
	// Timeout interrupts the run after this many milliseconds; 0 means no
	// limit. Not in the reference daemon.
	Timeout int64 `json:"timeout,omitempty"`
}
