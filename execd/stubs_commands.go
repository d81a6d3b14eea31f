package execd

import (
	"net/http"
	"time"

	"github.com/opensandbox/opensandbox/internal/httpx"
)

// TODO(commands): replace with command.go and session.go.

var errTODO = httpx.Errorf(http.StatusNotImplemented, "NOT_SUPPORTED", "not implemented yet")

type commandTable struct{}

func newCommandTable(ttl time.Duration, max int) *commandTable { return &commandTable{} }
func (t *commandTable) evict(now time.Time)                    {}
func (t *commandTable) closeAll()                              {}

func (s *Server) runCommand(w http.ResponseWriter, r *http.Request) error          { return errTODO }
func (s *Server) interrupt(w http.ResponseWriter, r *http.Request) error           { return errTODO }
func (s *Server) commandStatusOrLogs(w http.ResponseWriter, r *http.Request) error { return errTODO }

type sessionTable struct{}

func newSessionTable() *sessionTable { return &sessionTable{} }
func (t *sessionTable) closeAll()    {}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) error { return errTODO }
func (s *Server) runInSession(w http.ResponseWriter, r *http.Request) error  { return errTODO }
func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) error { return errTODO }
