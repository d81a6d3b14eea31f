package kubernetes

import (
	"context"
	"log/slog"

	"k8s.io/klog/v2"
)

// routeKlog sends client-go's own log (klog, one per process: the last
// runtime made wins) to the server's logger, one level lower: client-go
// reports at Info what is routine here (lease renewals) and at Error what
// the runtime handles itself (a lost race to create the lease).
func routeKlog(logger *slog.Logger) {
	klog.SetSlogLogger(slog.New(demoted{logger.Handler().WithAttrs([]slog.Attr{slog.String("source", "client-go")})}))
}

// demoted is a handler that lowers every record by one level.
type demoted struct{ h slog.Handler }

const levelStep = slog.LevelInfo - slog.LevelDebug

func (d demoted) Enabled(ctx context.Context, l slog.Level) bool {
	return d.h.Enabled(ctx, l-levelStep)
}

func (d demoted) Handle(ctx context.Context, r slog.Record) error {
	r.Level -= levelStep
	return d.h.Handle(ctx, r)
}

func (d demoted) WithAttrs(attrs []slog.Attr) slog.Handler { return demoted{d.h.WithAttrs(attrs)} }
func (d demoted) WithGroup(name string) slog.Handler       { return demoted{d.h.WithGroup(name)} }
