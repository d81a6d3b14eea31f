package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/opensandbox/opensandbox/ingress"
)

// envAPIKey holds the lifecycle server's API key.
const envAPIKey = "OSB_API_KEY"

// The lifecycle server as the source of sandboxes: --server URL, the API
// key from $OSB_API_KEY or --api-key-file.
func init() {
	var serverURL, keyFile string
	var getenv func(string) string
	registerSource(&source{
		name: "server",
		flags: func(fs *flag.FlagSet, env func(string) string) {
			getenv = env
			fs.StringVar(&serverURL, "server", "", "find sandboxes through the lifecycle server at this URL (http://host:port); its API key comes from $"+envAPIKey+" or --api-key-file")
			fs.StringVar(&keyFile, "api-key-file", "", "file holding the lifecycle server's API key (instead of $"+envAPIKey+")")
		},
		chosen: func() bool { return serverURL != "" },
		open: func(ctx context.Context, log *slog.Logger) (ingress.Resolver, ingress.Renewer, error) {
			key := getenv(envAPIKey)
			if keyFile != "" {
				b, err := os.ReadFile(keyFile)
				if err != nil {
					return nil, nil, fmt.Errorf("--api-key-file: %w", err)
				}
				key = strings.TrimSpace(string(b))
			}
			if key == "" {
				log.Warn("no API key for the lifecycle server: only a server started with --insecure will answer; set $" + envAPIKey + " or --api-key-file")
			}
			r, err := ingress.NewServerResolver(serverURL, key, nil)
			if err != nil {
				return nil, nil, errors.New("--server: " + err.Error())
			}
			return r, r, nil
		},
		where: func() string { return "the lifecycle server at " + serverURL },
	})
}
