package kubernetes

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"
)

var (
	klogOnce sync.Once
	// klogTarget is where client-go's log goes: the handler of the last
	// runtime made. klog's own logger is set once (it may not change while
	// client-go logs); this pointer changes instead.
	klogTarget atomic.Pointer[slog.Handler]
)

// routeKlog sends client-go's own log (klog, one per process) to the
// server's logger, one level lower: client-go reports at Info what is
// routine here (lease renewals) and at Error what the runtime handles
// itself (a lost race to create the lease).
func routeKlog(logger *slog.Logger) {
	h := logger.Handler().WithAttrs([]slog.Attr{slog.String("source", "client-go")})
	klogTarget.Store(&h)
	klogOnce.Do(func() { klog.SetSlogLogger(slog.New(demoted{})) })
}

// demoted is a handler that lowers every record by one level and passes
// it to klogTarget. Its attributes and groups are kept as closures over
// the target, so a later target gets them too.
type demoted struct {
	wrap func(slog.Handler) slog.Handler
}

const levelStep = slog.LevelInfo - slog.LevelDebug

func (d demoted) target() slog.Handler {
	h := *klogTarget.Load()
	if d.wrap != nil {
		h = d.wrap(h)
	}
	return h
}

func (d demoted) Enabled(ctx context.Context, l slog.Level) bool {
	return d.target().Enabled(ctx, l-levelStep)
}

func (d demoted) Handle(ctx context.Context, r slog.Record) error {
	r.Level -= levelStep
	return d.target().Handle(ctx, r)
}

func (d demoted) WithAttrs(attrs []slog.Attr) slog.Handler {
	prev := d.wrap
	return demoted{wrap: func(h slog.Handler) slog.Handler {
		if prev != nil {
			h = prev(h)
		}
		return h.WithAttrs(attrs)
	}}
}

func (d demoted) WithGroup(name string) slog.Handler {
	prev := d.wrap
	return demoted{wrap: func(h slog.Handler) slog.Handler {
		if prev != nil {
			h = prev(h)
		}
		return h.WithGroup(name)
	}}
}
