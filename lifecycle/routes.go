package lifecycle

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// routes lists the whole lifecycle API, mounted at the root and under
// /v1. The proxy route, /sandboxes/{id}/proxy/{port}[/{path...}], is
// dispatched by serve before this table (see parseProxyPath). A known path
// with another method answers 405, any other path 404, both with the
// error envelope.
func (s *Server) routes() {
	table := []struct {
		method, path string
		h            func(http.ResponseWriter, *http.Request) error
	}{
		{"GET", "/health", s.health},
		{"GET", "/metrics", s.serveMetrics},
		{"GET", "/limits", s.limits},

		{"POST", "/sandboxes", s.createSandbox},
		{"GET", "/sandboxes", s.listSandboxes},
		{"GET", "/sandboxes/{id}", s.getSandbox},
		{"DELETE", "/sandboxes/{id}", s.deleteSandbox},
		{"PATCH", "/sandboxes/{id}/metadata", s.patchMetadata},
		{"POST", "/sandboxes/{id}/pause", s.pauseSandbox},
		{"POST", "/sandboxes/{id}/resume", s.resumeSandbox},
		{"POST", "/sandboxes/{id}/renew-expiration", s.renewExpiration},
		{"GET", "/sandboxes/{id}/endpoints/{port}", s.getEndpoint},

		{"POST", "/sandboxes/{id}/snapshots", s.createSnapshot},
		{"GET", "/snapshots", s.listSnapshots},
		{"GET", "/snapshots/{id}", s.getSnapshot},
		{"DELETE", "/snapshots/{id}", s.deleteSnapshot},

		{"GET", "/sandboxes/{id}/diagnostics/logs", s.diagnosticLogs},
		{"GET", "/sandboxes/{id}/diagnostics/events", s.diagnosticEvents},
		{"GET", "/sandboxes/{id}/diagnostics/inspect", s.diagnosticInspect},
		{"GET", "/sandboxes/{id}/diagnostics/summary", s.diagnosticSummary},

		{"GET", "/ingress/targets/{id}/{port}", s.ingressTarget},
		{"POST", "/ingress/renew/{id}", s.ingressRenew},

		{"GET", "/pools", s.listPools},
		{"POST", "/pools", s.createPool},
		{"GET", "/pools/{name}", s.getPool},
		{"PUT", "/pools/{name}", s.updatePool},
		{"DELETE", "/pools/{name}", s.deletePool},
	}
	allowed := map[string][]string{}
	for _, prefix := range []string{"", "/v1"} {
		for _, rt := range table {
			p := prefix + rt.path
			s.mux.Handle(rt.method+" "+p, s.handle(rt.h))
			allowed[p] = append(allowed[p], rt.method)
		}
	}
	for p, methods := range allowed {
		if slices.Contains(methods, "GET") {
			methods = append(methods, "HEAD")
		}
		allow := strings.Join(methods, ", ")
		s.mux.Handle(p, s.handle(func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Allow", allow)
			return httpErr(http.StatusMethodNotAllowed, codeMethodNotAllowed, "method "+r.Method+" is not allowed here (allowed: "+allow+")")
		}))
	}
	s.mux.Handle("/", s.handle(func(w http.ResponseWriter, r *http.Request) error {
		return httpErr(http.StatusNotFound, codeNotFound, "no route for "+r.Method+" "+r.URL.Path)
	}))
}

// health answers GET /health, which needs no API key, with the server's
// version when it has one.
func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.Health{Status: "healthy", Version: s.cfg.Version})
}

// limits answers GET /limits with the timeout bounds createSandbox and
// renewals enforce (expiryOf, Manager.Renew).
func (s *Server) limits(w http.ResponseWriter, r *http.Request) error {
	l := api.Limits{MinTimeoutSeconds: int64(s.cfg.MinTimeout / time.Second), NoExpiryAllowed: true}
	if s.cfg.MaxTimeout > 0 {
		maxSec := int64(s.cfg.MaxTimeout / time.Second)
		l.MaxTimeoutSeconds = &maxSec
	}
	return writeJSON(w, http.StatusOK, l)
}

// serveMetrics answers GET /metrics with the Prometheus text format;
// serve has checked the credentials that MetricsPublic asks for.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) error {
	s.scrape.ServeHTTP(w, r)
	return nil
}
