package sandbox

import "errors"

// Error kinds. Runtimes and the manager wrap these (fmt.Errorf("...: %w",
// ErrNotFound)); only the HTTP layer turns them into status codes.
var (
	// ErrNotFound: the sandbox or snapshot does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request cannot be carried out as given.
	ErrInvalid = errors.New("invalid")
	// ErrConflict: the object is not in a state that allows the operation.
	ErrConflict = errors.New("conflict")
	// ErrNotImplemented: the runtime does not support the operation.
	ErrNotImplemented = errors.New("not implemented")
	// ErrUnavailable: a dependency (engine, registry) cannot be reached.
	ErrUnavailable = errors.New("unavailable")
)

// CodedError adds an API error code to an error kind, for the codes the
// clients know (DOCKER::SANDBOX_NOT_RUNNING, SNAPSHOT::NOT_READY, ...).
type CodedError struct {
	Code string
	Msg  string
	Kind error // one of the Err* sentinels
}

func (e *CodedError) Error() string { return e.Msg }

// Unwrap lets errors.Is find the kind.
func (e *CodedError) Unwrap() error { return e.Kind }

// Coded returns a *CodedError.
func Coded(kind error, code, msg string) error {
	return &CodedError{Code: code, Msg: msg, Kind: kind}
}
