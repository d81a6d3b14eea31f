package kubernetes

import (
	"context"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// elect takes part in the election of the replica that keeps house, until
// the runtime closes. The leader fills the pools; the lifecycle manager
// asks Leading before it enforces expiry and calls Reconcile. A leader
// that closes gives the lease up at once, so another replica takes over
// without waiting for it to expire.
func (r *Runtime) elect() {
	defer r.wg.Done()
	lock := &resourcelock.LeaseLock{
		Client:     r.cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: r.cfg.Identity},
	}
	lock.LeaseMeta.Name, lock.LeaseMeta.Namespace = r.cfg.LeaseName, r.ns
	for r.ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   r.cfg.LeaseDuration,
			RenewDeadline:   r.cfg.RenewDeadline,
			RetryPeriod:     r.cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            r.cfg.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: r.lead,
				OnStoppedLeading: func() {
					if r.leading.Swap(false) {
						r.log.Info("no longer the leader")
					}
				},
			},
		})
		if err != nil {
			r.log.Error("leader election", "err", err)
			return
		}
		le.Run(r.ctx) // returns when leadership is lost or the runtime closes
		select {
		case <-r.ctx.Done():
		case <-time.After(r.cfg.RetryPeriod):
		}
	}
}

// lead is called by client-go, in a goroutine of its own, when this
// replica wins the lease; ctx ends with the term. It hands the term to
// the runtime's housekeeping goroutine and reports leading meanwhile.
func (r *Runtime) lead(ctx context.Context) {
	term := r.term.Add(1)
	r.leading.Store(true)
	select {
	case r.terms <- ctx:
	case <-ctx.Done():
	}
	<-ctx.Done()
	if r.term.Load() == term { // not a later term's
		r.leading.Store(false)
	}
}

// housekeep runs the leader's loops for each term this replica wins,
// until the runtime closes.
func (r *Runtime) housekeep() {
	defer r.wg.Done()
	for {
		select {
		case <-r.ctx.Done():
			return
		case term := <-r.terms:
			if term.Err() != nil {
				continue
			}
			r.log.Info("leading: this replica enforces expiry, removes orphans and fills the pools", "lease", r.cfg.LeaseName)
			r.poolLoop(term)
		}
	}
}
