package main

import (
	"cmp"
	"context"
	"flag"
	"log/slog"
	"strings"

	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/runtime/kubernetes"
)

// The cluster as the source of sandboxes: --kubernetes watches the
// sandbox pods of the --namespace(s) itself, so the gateway routes with
// no lifecycle server in the path. It may only read pods; renew-on-access
// goes to the lifecycle server given with --server, when there is one.
func init() {
	var (
		on         bool
		namespaces stringList
		kubeconfig string
		scope      string
		// watched is what the resolver watches, once open.
		watched *kubernetes.PodResolver
	)
	registerSource(&source{
		name: "kubernetes",
		flags: func(fs *flag.FlagSet, _ func(string) string) {
			namespaces, watched = nil, nil // a second ParseFlags starts afresh
			fs.BoolVar(&on, "kubernetes", false, "find sandboxes from their pods in the cluster (informers; the gateway's service account needs get, list and watch on pods); with --server, renew-on-access goes to that server")
			fs.Var(&namespaces, "namespace", "with --kubernetes: a namespace of sandbox pods (repeatable, or a comma list; default: the kubeconfig context's, in a cluster the gateway's own)")
			fs.StringVar(&kubeconfig, "kubeconfig", "", "with --kubernetes: kubeconfig file (default $KUBECONFIG, ~/.kube/config, else in-cluster)")
			fs.StringVar(&scope, "label-scope", "", `with --kubernetes: the servers' runtime.kubernetes.label_scope (default "default")`)
		},
		chosen: func() bool { return on },
		open: func(ctx context.Context, log *slog.Logger) (ingress.Resolver, ingress.Renewer, error) {
			r, err := kubernetes.NewPodResolver(kubernetes.PodResolverConfig{
				Kubeconfig: kubeconfig, Namespaces: namespaces, LabelScope: scope,
			}, log)
			if err != nil {
				return nil, nil, err
			}
			context.AfterFunc(ctx, func() { r.Close() })
			watched = r
			return r, nil, nil
		},
		renewVia: "server",
		where: func() string {
			ns, sc := strings.Join(namespaces, ", "), cmp.Or(scope, "default")
			if watched != nil {
				ns, sc = strings.Join(watched.Namespaces(), ", "), watched.LabelScope()
			}
			if ns == "" {
				ns = "the kubeconfig context's"
			}
			return "the cluster's sandbox pods of label scope " + sc + " in namespaces " + ns
		},
	})
}

// stringList is a flag that may be repeated, each value a comma list.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}
