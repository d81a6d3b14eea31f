package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Housekeeping bounds.
const (
	// orphanAge is how old a token Secret without its pod must be before
	// it is removed: a create makes the Secret first, and its pod follows
	// within the create's request.
	orphanAge = time.Minute
	// handoverTimeout is how long a claim may take to hand a warm pod
	// over before the pod is taken for abandoned (its server died during
	// the claim) and removed.
	handoverTimeout = 30 * time.Second
)

// annOwnedClaims lists, as JSON, the PersistentVolumeClaims made for a
// sandbox and deleted with it.
const annOwnedClaims = "opensandbox.io/owned-claims"

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// Reconcile removes what interrupted operations left behind: token
// Secrets whose pod is gone, and warm pods whose hand-over was abandoned.
// The lifecycle manager calls it on the leader only.
func (r *Runtime) Reconcile(ctx context.Context) error {
	start := time.Now()
	err := r.reconcile(ctx)
	r.cfg.Observer.Reconciled(sandbox.LoopRuntime, time.Since(start), err)
	return err
}

func (r *Runtime) reconcile(ctx context.Context) error {
	var errs []error
	now := time.Now()
	secrets, err := r.secrets.List(labels.SelectorFromSet(labels.Set{labelKind: kindToken}))
	if err != nil {
		return err
	}
	for _, s := range secrets {
		if _, err := r.pods.Get(s.Name); err == nil || now.Sub(s.CreationTimestamp.Time) < orphanAge {
			continue
		}
		if r.podWrite.isDeleted(s.Name) {
			continue // being deleted by this replica
		}
		// The informer may lag: ask the API server before deleting.
		if _, err := r.cs.CoreV1().Pods(r.ns).Get(ctx, s.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			continue
		}
		r.log.Info("removing the token secret of a sandbox that is gone", "secret", s.Name)
		if err := r.cs.CoreV1().Secrets(r.ns).Delete(ctx, s.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &s.UID}}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete orphaned secret %s: %w", s.Name, err))
		}
	}
	pods, err := r.pods.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, pod := range pods {
		h := pod.Annotations[annHandover]
		if h == "" || pod.DeletionTimestamp != nil {
			continue
		}
		if t, err := time.Parse(time.RFC3339Nano, h); err == nil && now.Sub(t) < handoverTimeout {
			continue
		}
		r.log.Warn("removing a warm sandbox whose hand-over was interrupted", "sandbox", pod.Labels[labelID])
		if err := r.remove(ctx, pod, true); err != nil && !errors.Is(err, sandbox.ErrNotFound) && !errors.Is(err, errChanged) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deletePullSecret removes the registry credentials of a sandbox's create.
func (r *Runtime) deletePullSecret(ctx context.Context, id sandbox.ID) {
	if err := r.cs.CoreV1().Secrets(r.ns).Delete(ctx, pullSecretName(id), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		r.log.Warn("delete the registry credentials of a create", "sandbox", id, "err", err)
	}
}

// dropPullSecrets removes registry credentials that have served: their
// sandbox's container has started (the image is on the node), or the
// sandbox failed or is gone. Runtimes keep no credentials beyond the
// create they came with.
func (r *Runtime) dropPullSecrets(ctx context.Context) {
	secrets, err := r.secrets.List(labels.SelectorFromSet(labels.Set{labelKind: kindPull}))
	if err != nil {
		return
	}
	now := time.Now()
	for _, s := range secrets {
		id := sandbox.ID(s.Labels[labelID])
		pod := r.pod(id)
		switch {
		case pod == nil:
			if now.Sub(s.CreationTimestamp.Time) < orphanAge {
				continue // its pod may not be seen yet
			}
		case !containerStarted(pod).IsZero(), r.view(pod).Status.State == sandbox.StateFailed:
		default:
			continue // still pulling
		}
		r.deletePullSecret(ctx, id)
	}
}

// makeClaims creates the PersistentVolumeClaims a sandbox asks to have
// made, and returns the names of those to delete with it.
func (r *Runtime) makeClaims(ctx context.Context, id sandbox.ID, vols []sandbox.Volume) ([]string, error) {
	var owned []string
	for _, v := range vols {
		c := v.Claim
		if c == nil || !c.CreateIfNotExists {
			continue
		}
		if _, err := r.cs.CoreV1().PersistentVolumeClaims(r.ns).Get(ctx, c.Name, metav1.GetOptions{}); err == nil {
			continue
		} else if !apierrors.IsNotFound(err) {
			r.deleteClaims(context.WithoutCancel(ctx), owned)
			return nil, apiError("look up volume claim "+c.Name, err)
		}
		pvc, err := claimFor(&r.cfg, r.ns, id, c)
		if err == nil {
			_, err = r.cs.CoreV1().PersistentVolumeClaims(r.ns).Create(ctx, pvc, metav1.CreateOptions{})
			if err != nil {
				err = apiError("create volume claim "+c.Name, err)
			}
		}
		if err != nil {
			r.deleteClaims(context.WithoutCancel(ctx), owned)
			return nil, err
		}
		if c.DeleteOnTermination {
			owned = append(owned, c.Name)
		}
	}
	return owned, nil
}

// claimFor is the PersistentVolumeClaim made for a sandbox's volume.
func claimFor(cfg *Config, ns string, id sandbox.ID, c *sandbox.Claim) (*corev1.PersistentVolumeClaim, error) {
	size := c.Size
	if size == "" {
		size = "1Gi"
	}
	q, err := resource.ParseQuantity(size)
	if err != nil {
		return nil, sandbox.Coded(sandbox.ErrInvalid, api.CodeVolumeInvalidSize, fmt.Sprintf("volume claim %s: size %q is not a quantity", c.Name, c.Size))
	}
	modes := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	if len(c.AccessModes) > 0 {
		modes = modes[:0]
		for _, m := range c.AccessModes {
			modes = append(modes, corev1.PersistentVolumeAccessMode(m))
		}
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: ns, Labels: map[string]string{labelScope: cfg.LabelScope}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: modes,
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: q}},
		},
	}
	if c.DeleteOnTermination {
		pvc.Labels[labelOwner] = string(id)
	}
	if c.StorageClass != "" {
		sc := c.StorageClass
		pvc.Spec.StorageClassName = &sc
	}
	return pvc, nil
}

// ownClaims makes the sandbox's pod the owner of the volume claims made
// for it, so that the cluster's garbage collector removes them with the
// pod even when the pod goes without this server (kubectl delete, an
// eviction).
func (r *Runtime) ownClaims(ctx context.Context, pod *corev1.Pod, names []string) {
	ref := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{ref}}})
	for _, name := range names {
		if _, err := r.cs.CoreV1().PersistentVolumeClaims(r.ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			r.log.Warn("make the sandbox the owner of its volume claim", "claim", name, "err", err)
		}
	}
}

// deleteClaims deletes volume claims made for a sandbox.
func (r *Runtime) deleteClaims(ctx context.Context, names []string) {
	for _, name := range names {
		if err := r.cs.CoreV1().PersistentVolumeClaims(r.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			r.log.Warn("delete a sandbox's volume claim", "claim", name, "err", err)
		}
	}
}

// Logs returns the output of the sandbox's main container.
func (r *Runtime) Logs(ctx context.Context, id sandbox.ID, tail int, since time.Time) (string, error) {
	pod, err := r.sandboxPod(ctx, id)
	if err != nil {
		return "", err
	}
	opts := &corev1.PodLogOptions{Container: containerSandbox}
	if tail > 0 {
		t := int64(tail)
		opts.TailLines = &t
	}
	if !since.IsZero() {
		opts.SinceTime = &metav1.Time{Time: since}
	}
	b, err := r.cs.CoreV1().Pods(r.ns).GetLogs(pod.Name, opts).DoRaw(ctx)
	if err != nil {
		var status apierrors.APIStatus
		if errors.As(err, &status) && (apierrors.IsBadRequest(err) || apierrors.IsNotFound(err)) {
			return "", nil // the container has not started (yet, or any more): no output
		}
		return "", apiError("read the sandbox's log", err)
	}
	return string(b), nil
}

// Events returns the sandbox's creation, its claim, and the cluster's
// events about its pod, oldest first.
func (r *Runtime) Events(ctx context.Context, id sandbox.ID) ([]sandbox.Event, error) {
	pod, err := r.sandboxPod(ctx, id)
	if err != nil {
		return nil, err
	}
	sb := r.view(pod)
	out := []sandbox.Event{{Time: sb.CreatedAt, Source: sandbox.SourceLifecycle, Type: "CREATED", Message: "image " + sb.Image}}
	list, err := r.cs.CoreV1().Events(r.ns).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Pod,involvedObject.name=" + pod.Name + ",involvedObject.uid=" + string(pod.UID)})
	if err != nil {
		return nil, apiError("list the pod's events", err)
	}
	for _, e := range list.Items {
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		if at.IsZero() {
			at = e.CreationTimestamp.Time
		}
		msg := e.Message
		if e.Count > 1 {
			msg += fmt.Sprintf(" (%d times)", e.Count)
		}
		out = append(out, sandbox.Event{Time: at.UTC(), Source: sandbox.SourceRuntime, Type: strings.ToUpper(e.Reason), Message: msg})
	}
	if st := sb.Status; st.State != sandbox.StatePending {
		out = append(out, sandbox.Event{Time: st.Since, Source: sandbox.SourceLifecycle, Type: strings.ToUpper(string(st.State)),
			Message: strings.TrimPrefix(st.Reason+": "+st.Message, ": ")})
	}
	// The kubelet's events carry whole seconds: events of one second keep
	// the order they were recorded in, the creation first.
	slices.SortStableFunc(out, func(a, b sandbox.Event) int {
		return a.Time.Truncate(time.Second).Compare(b.Time.Truncate(time.Second))
	})
	return out, nil
}

// Inspect returns the sandbox's pod as YAML.
func (r *Runtime) Inspect(ctx context.Context, id sandbox.ID) (string, error) {
	pod, err := r.sandboxPod(ctx, id)
	if err != nil {
		return "", err
	}
	b, err := yaml.Marshal(pod)
	if err != nil {
		return "", err
	}
	return string(b), nil
}
