package execd

import "net/http"

// routes lists the whole execd API. Routes that work on the file system
// are gated: at most fileOps of them run at once (see threads.go); so are
// command logs (commandStatusOrLogs).
func (s *Server) routes() {
	s.mux.Handle("POST /claim", s.handle(s.claimSandbox))
	s.mux.HandleFunc("GET /ping", func(w http.ResponseWriter, r *http.Request) {})

	s.mux.Handle("POST /command", s.handle(s.runCommand))
	s.mux.Handle("DELETE /command", s.handle(s.interrupt))
	// One pattern serves /command/status/{id} and /command/{id}/logs,
	// which the standard mux would reject as overlapping.
	s.mux.Handle("GET /command/{a}/{b}", s.handle(s.commandStatusOrLogs))

	s.mux.Handle("POST /code/context", s.handle(s.createCodeContext))
	s.mux.Handle("GET /code/contexts", s.handle(s.listCodeContexts))
	s.mux.Handle("DELETE /code/contexts", s.handle(s.deleteCodeContexts))
	s.mux.Handle("GET /code/contexts/{id}", s.handle(s.getCodeContext))
	s.mux.Handle("DELETE /code/contexts/{id}", s.handle(s.deleteCodeContext))
	s.mux.Handle("POST /code", s.handle(s.runCode))
	s.mux.Handle("DELETE /code", s.handle(s.interrupt))

	s.mux.Handle("POST /session", s.handle(s.createSession))
	s.mux.Handle("POST /session/{id}/run", s.handle(s.runInSession))
	s.mux.Handle("DELETE /session/{id}", s.handle(s.deleteSession))

	s.mux.Handle("POST /pty", s.handle(s.createPTY))
	s.mux.Handle("GET /pty/{id}", s.handle(s.getPTY))
	s.mux.Handle("DELETE /pty/{id}", s.handle(s.deletePTY))
	s.mux.Handle("GET /pty/{id}/ws", s.handle(s.attachPTY))

	s.mux.Handle("GET /files/info", s.gated(s.handle(s.fileInfo)))
	s.mux.Handle("DELETE /files", s.gated(s.handle(s.deleteFiles)))
	s.mux.Handle("POST /files/permissions", s.gated(s.handle(s.setPermissions)))
	s.mux.Handle("POST /files/mv", s.gated(s.handle(s.moveFiles)))
	s.mux.Handle("GET /files/search", s.gated(s.handle(s.searchFiles)))
	s.mux.Handle("POST /files/replace", s.gated(s.handle(s.replaceInFiles)))
	s.mux.Handle("POST /files/upload", s.gated(s.handle(s.upload)))
	s.mux.Handle("GET /files/download", s.gated(s.handle(s.download)))
	s.mux.Handle("GET /files/archive", s.gated(s.handle(s.downloadArchive)))
	s.mux.Handle("POST /files/archive", s.gated(s.handle(s.uploadArchive)))
	s.mux.Handle("GET /directories/list", s.gated(s.handle(s.listDirectory)))
	s.mux.Handle("POST /directories", s.gated(s.handle(s.makeDirectories)))
	s.mux.Handle("DELETE /directories", s.gated(s.handle(s.removeDirectories)))

	s.mux.Handle("GET /metrics", s.handle(s.getMetrics))
	s.mux.Handle("GET /metrics/watch", s.handle(s.watchMetrics))

	// Any method on /proxy/{port}[/{path...}] goes to the port proxy. It
	// bypasses the mux, which would redirect paths it finds untidy
	// ("//", "/./") where the proxy must forward them as they are.
	s.proxyHandler = s.proxy()
}
