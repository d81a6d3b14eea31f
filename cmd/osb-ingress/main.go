// Command osb-ingress is the ingress gateway: one address in front of
// every sandbox's ports. It routes a request by the OpenSandbox-Ingress-To
// header, a {sandboxId}-{port} subdomain or a /{sandboxId}/{port}/ path,
// checks the sandbox's access token or the route's signature, and streams
// the exchange to the sandbox.
//
//	osb-ingress --server http://127.0.0.1:8080 --signing-keys-file keys [flags]
//	osb-ingress --version
//
// Where it finds sandboxes is chosen by a flag: --server asks the
// lifecycle server (Docker), other sources add their own flag. The API
// key for the server comes from $OSB_API_KEY or --api-key-file. The
// signing keys file ("ID:BASE64" lines, the signing key first) is read
// again on SIGHUP and whenever its modification time changes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	m := NewMain()
	if err := m.ParseFlags(os.Args[1:], os.Getenv, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		if errors.Is(err, errVersion) {
			fmt.Println("osb-ingress", version)
			return
		}
		fmt.Fprintln(os.Stderr, "osb-ingress:", err)
		os.Exit(2)
	}
	if err := m.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "osb-ingress:", err)
		os.Exit(1)
	}
}

var errVersion = errors.New("version requested")
