package execd

import "net/http"

// TODO(files): replace with files.go, upload.go, download.go.

func (s *Server) fileInfo(w http.ResponseWriter, r *http.Request) error          { return errTODO }
func (s *Server) deleteFiles(w http.ResponseWriter, r *http.Request) error       { return errTODO }
func (s *Server) setPermissions(w http.ResponseWriter, r *http.Request) error    { return errTODO }
func (s *Server) moveFiles(w http.ResponseWriter, r *http.Request) error         { return errTODO }
func (s *Server) searchFiles(w http.ResponseWriter, r *http.Request) error       { return errTODO }
func (s *Server) replaceInFiles(w http.ResponseWriter, r *http.Request) error    { return errTODO }
func (s *Server) upload(w http.ResponseWriter, r *http.Request) error            { return errTODO }
func (s *Server) download(w http.ResponseWriter, r *http.Request) error          { return errTODO }
func (s *Server) listDirectory(w http.ResponseWriter, r *http.Request) error     { return errTODO }
func (s *Server) makeDirectories(w http.ResponseWriter, r *http.Request) error   { return errTODO }
func (s *Server) removeDirectories(w http.ResponseWriter, r *http.Request) error { return errTODO }
