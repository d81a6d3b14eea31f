package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// The steps of a pod's life the harness times, as its watch first sees
// them. Watch events arrive within milliseconds of the API server's
// write, so these times are far finer than the pod's own timestamps,
// which have whole seconds.
const (
	stepSeen      = "pod created"            // the watch has the pod
	stepScheduled = "scheduled"              // bound to a node
	stepInitRun   = "init container running" // the kubelet reported the init container running (sandboxes only)
	stepInit      = "init container done"    // the kubelet reported it exited: execd is copied in
	stepStarted   = "container running"      // the kubelet reported the main container running
	stepReady     = "Ready"                  // the Ready condition (the sandbox's TCP probe)
	stepTaken     = "warm pod taken"         // a claim removed the warm label
	stepToken     = "token secret patched"   // a claim stored the new token
	stepHandedIn  = "hand-over finished"     // a claim removed the hand-over mark
	stepGone      = "deleted"                // the pod is gone
)

// Annotations and labels of the runtime's pods that the steps read.
const (
	labelWarm   = "opensandbox.io/warm"
	labelID     = "opensandbox.io/id"
	annHandover = "opensandbox.io/handover"
)

// podWatch records when the namespace's pods and secrets reach each step.
type podWatch struct {
	mu    sync.Mutex
	steps map[string]map[string]time.Time // pod name, step: first seen
	// secretRV is each secret's first resource version seen; a later one
	// is a claim's token patch.
	secretRV map[string]string
	wake     chan struct{} // closed and replaced on every change
}

// watchPods starts watching the namespace's pods and secrets until ctx
// ends.
func (c *cluster) watchPods(ctx context.Context) (*podWatch, error) {
	w := &podWatch{steps: map[string]map[string]time.Time{}, secretRV: map[string]string{}, wake: make(chan struct{})}
	f := informers.NewSharedInformerFactoryWithOptions(c.cs, 0, informers.WithNamespace(c.ns))
	pods := f.Core().V1().Pods().Informer()
	secrets := f.Core().V1().Secrets().Informer()
	pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.pod(obj, time.Now()) },
		UpdateFunc: func(_, obj any) { w.pod(obj, time.Now()) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				w.mark(p.Name, stepGone, time.Now())
			}
		},
	})
	secrets.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.secret(obj, time.Now()) },
		UpdateFunc: func(_, obj any) { w.secret(obj, time.Now()) },
	})
	f.Start(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for typ, ok := range f.WaitForCacheSync(sctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("watch %v in namespace %s: %w", typ, c.ns, errTimeout)
		}
	}
	return w, nil
}

func (w *podWatch) mark(pod, step string, t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.steps[pod]
	if m == nil {
		m = map[string]time.Time{}
		w.steps[pod] = m
	}
	if _, ok := m[step]; !ok {
		m[step] = t
		close(w.wake)
		w.wake = make(chan struct{})
	}
}

func (w *podWatch) pod(obj any, t time.Time) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mark(p.Name, stepSeen, t)
	if p.Spec.NodeName != "" {
		w.mark(p.Name, stepScheduled, t)
	}
	if len(p.Status.InitContainerStatuses) > 0 {
		switch st := p.Status.InitContainerStatuses[0].State; {
		case st.Running != nil:
			w.mark(p.Name, stepInitRun, t)
		case st.Terminated != nil:
			w.mark(p.Name, stepInit, t)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil && p.Status.PodIP != "" {
			w.mark(p.Name, stepStarted, t)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			w.mark(p.Name, stepReady, t)
		}
	}
	// A warm pod is taken when its warm label goes; its hand-over ends
	// when the mark the claim set goes.
	if p.Labels[labelID] != "" && p.Labels[labelWarm] == "" {
		if _, handing := p.Annotations[annHandover]; handing {
			w.mark(p.Name, stepTaken, t)
		} else if w.has(p.Name, stepTaken) {
			w.mark(p.Name, stepHandedIn, t)
		}
	}
}

func (w *podWatch) secret(obj any, t time.Time) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	w.mu.Lock()
	first, seen := w.secretRV[s.Name]
	if !seen {
		w.secretRV[s.Name] = s.ResourceVersion
	}
	w.mu.Unlock()
	// The sandbox's secret has its pod's name.
	if seen && first != s.ResourceVersion {
		w.mark(s.Name, stepToken, t)
	}
}

func (w *podWatch) has(pod, step string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.steps[pod][step]
	return ok
}

// at returns when the pod reached step, if it did.
func (w *podWatch) at(pod, step string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.steps[pod][step]
	return t, ok
}

// wait waits until the pod reaches step, for at most timeout.
func (w *podWatch) wait(ctx context.Context, pod, step string, timeout time.Duration) (time.Time, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		t, ok := w.steps[pod][step]
		wake := w.wake
		w.mu.Unlock()
		if ok {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-deadline.C:
			return time.Time{}, fmt.Errorf("pod %s: not %s after %v: %w", pod, step, timeout, errTimeout)
		case <-wake:
		}
	}
}
