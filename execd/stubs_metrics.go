package execd

import "net/http"

// TODO(metrics): replace with metrics.go and proxy.go.

type metricsSampler struct{}

func newMetricsSampler() *metricsSampler { return &metricsSampler{} }

func (s *Server) getMetrics(w http.ResponseWriter, r *http.Request) error   { return errTODO }
func (s *Server) watchMetrics(w http.ResponseWriter, r *http.Request) error { return errTODO }
func (s *Server) proxy() http.Handler {
	return s.handle(func(http.ResponseWriter, *http.Request) error { return errTODO })
}
