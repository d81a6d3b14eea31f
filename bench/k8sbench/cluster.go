package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// cluster is a client of the cluster and the namespace this run works in.
type cluster struct {
	kubeconfig string // absolute
	rest       *rest.Config
	cs         kubernetes.Interface
	ns         string
}

// connect reads the kubeconfig and checks, within 5 s, that the API
// server answers and has a node.
func connect(ctx context.Context, kubeconfig string) (*cluster, error) {
	abs, err := filepath.Abs(kubeconfig)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("no kubeconfig: %w", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", abs)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", abs, err)
	}
	// The baseline's requests come one at a time; the default rate limit
	// of 5 a second would still delay the polls of a fast run.
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nodes, err := cs.CoreV1().Nodes().List(cctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("the API server of %s does not answer: %w", abs, err)
	}
	if len(nodes.Items) == 0 {
		return nil, fmt.Errorf("the cluster of %s has no node", abs)
	}
	return &cluster{kubeconfig: abs, rest: cfg, cs: cs}, nil
}

// makeNamespace makes the run's namespace and waits until pods may be
// made in it (its default service account exists).
func (c *cluster) makeNamespace(ctx context.Context) error {
	var b [4]byte
	rand.Read(b[:])
	c.ns = "k8sbench-" + hex.EncodeToString(b[:])
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns, Labels: map[string]string{"opensandbox.io/bench": "k8sbench"}}}
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", c.ns, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := c.cs.CoreV1().ServiceAccounts(c.ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("namespace %s has no default service account after 30 s", c.ns)
		}
	}
}

// deleteNamespace deletes the run's pods at once and then its namespace
// with everything left in it; the cluster finishes the deletion in the
// background.
func (c *cluster) deleteNamespace() {
	if c.ns == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	zero := int64(0)
	c.cs.CoreV1().Pods(c.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	if err := c.cs.CoreV1().Namespaces().Delete(ctx, c.ns, metav1.DeleteOptions{}); err != nil {
		fmt.Fprintf(os.Stderr, "k8sbench: delete namespace %s: %v\n", c.ns, err)
	}
}
