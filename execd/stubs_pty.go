package execd

import (
	"net/http"
	"time"
)

// TODO(pty): replace with pty.go.

type ptyTable struct{}

func newPTYTable() *ptyTable                                        { return &ptyTable{} }
func (t *ptyTable) evict(now time.Time, idle, exited time.Duration) {}
func (t *ptyTable) closeAll()                                       {}

func (s *Server) createPTY(w http.ResponseWriter, r *http.Request) error { return errTODO }
func (s *Server) getPTY(w http.ResponseWriter, r *http.Request) error    { return errTODO }
func (s *Server) deletePTY(w http.ResponseWriter, r *http.Request) error { return errTODO }
func (s *Server) attachPTY(w http.ResponseWriter, r *http.Request) error { return errTODO }
