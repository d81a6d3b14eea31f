package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/opensandbox/opensandbox/sandbox"
)

// resourceGPU is the extended resource a sandbox's GPUs are asked as.
const resourceGPU corev1.ResourceName = "nvidia.com/gpu"

// errNodesUnknown: the runtime cannot read the cluster's nodes.
var errNodesUnknown = errors.New("the cluster's nodes are not readable by this server (grant get, list and watch on nodes to check creates against them)")

// watchNodes starts an informer of the cluster's nodes, for HostSize, if
// this server may list them. Nodes are cluster-scoped, which the
// server's namespaced Role does not reach: without a ClusterRole that
// allows it, creates are not checked against node sizes, and the
// runtime says so once.
func (r *Runtime) watchNodes() {
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	_, err := r.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
	switch {
	case apierrors.IsForbidden(err):
		r.log.Info("nodes are not readable: creates are not checked against node sizes (grant get, list and watch on nodes to have them checked)")
		return
	case err != nil:
		r.log.Warn("list nodes: creates are not checked against node sizes", "err", err)
		return
	}
	r.nodeFactory = informers.NewSharedInformerFactory(r.cs, 0)
	inf := r.nodeFactory.Core().V1().Nodes()
	if err := inf.Informer().SetTransform(slimNode); err != nil {
		r.log.Warn("watch nodes: creates are not checked against node sizes", "err", err)
		r.nodeFactory = nil
		return
	}
	r.nodes = inf.Lister()
	r.nodesSynced = inf.Informer().HasSynced
	r.nodeFactory.Start(r.ctx.Done())
	// Wait for the first list, so that the first creates are checked
	// too; should it take longer, they are not until it arrives.
	if !cache.WaitForCacheSync(ctx.Done(), r.nodesSynced) {
		r.log.Warn("the node informer has not synced in 10 s: creates are checked against node sizes once it has")
	}
}

// slimNode keeps of a node what HostSize reads: a node's status lists
// every image it holds, which the informer need not keep.
func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: n.Namespace, UID: n.UID, ResourceVersion: n.ResourceVersion},
		Status:     corev1.NodeStatus{Capacity: n.Status.Capacity, Allocatable: n.Status.Allocatable},
	}, nil
}

// HostSize reports the largest node of the cluster by what it can give
// pods (its allocatable CPU, memory and nvidia.com/gpu), from the node
// informer. Every node counts, tainted and cordoned ones included: the
// check is an upper bound, the scheduler decides the rest. It fails
// when this server may not read nodes.
func (r *Runtime) HostSize(ctx context.Context) (sandbox.HostSize, error) {
	if r.nodes == nil {
		return sandbox.HostSize{}, errNodesUnknown
	}
	if !r.nodesSynced() {
		return sandbox.HostSize{}, errors.New("the node informer has not synced yet")
	}
	nodes, err := r.nodes.List(labels.Everything())
	if err != nil {
		return sandbox.HostSize{}, fmt.Errorf("list nodes: %w", err)
	}
	return largestNode(nodes), nil
}

// largestNode is the HostSize of the largest of nodes, per resource: its
// capacity, what the node has (a limit may go past what the node sets
// aside for pods, its allocatable, as on Docker it may go past what is
// free; only more than the node has can never be honoured). No node
// leaves everything unknown.
func largestNode(nodes []*corev1.Node) sandbox.HostSize {
	var s sandbox.HostSize
	if len(nodes) == 0 {
		return s
	}
	s.GPUsKnown = true
	s.Where = "the largest node of the cluster"
	if len(nodes) == 1 {
		s.Where = "the cluster's node (" + nodes[0].Name + ")"
	}
	for _, n := range nodes {
		a := n.Status.Capacity
		if len(a) == 0 {
			a = n.Status.Allocatable
		}
		s.CPUMillis = max(s.CPUMillis, quantity(a, corev1.ResourceCPU, true))
		s.MemoryBytes = max(s.MemoryBytes, quantity(a, corev1.ResourceMemory, false))
		s.GPUs = max(s.GPUs, quantity(a, resourceGPU, false))
	}
	return s
}

// quantity reads a resource of a list, in thousandths when milli is set.
func quantity(l corev1.ResourceList, name corev1.ResourceName, milli bool) int64 {
	q, ok := l[name]
	if !ok {
		return 0
	}
	if milli {
		return q.MilliValue()
	}
	return q.Value()
}

// ExtensionKeys returns the extensions the runtime reads:
// kubernetes.runtimeClassName, and opensandbox.extensions.*, which it
// copies to pod annotations opensandbox.io/extensions.<suffix>, as the
// reference's Kubernetes server does.
func (r *Runtime) ExtensionKeys() []string {
	return []string{extRuntimeClass, extPassThrough + "*"}
}
