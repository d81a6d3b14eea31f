package cli

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/sdk"
)

// clientVersion is osb's version: Version when the build set it (make
// build stamps `git describe`), else the commit the binary was built from
// as Go recorded it (seven hex digits, "-dirty" for uncommitted changes,
// as `git describe --always --dirty` writes it), else "dev".
var clientVersion = sync.OnceValue(func() string {
	if Version != "" && Version != "dev" {
		return Version
	}
	if v := vcsVersion(); v != "" {
		return v
	}
	return "dev"
})

// vcsVersion reads the build's vcs.revision and vcs.modified; "" when the
// binary was built outside a repository or with -buildvcs=false.
func vcsVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev string
	var dirty bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return ""
	}
	rev = rev[:min(len(rev), 7)]
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// versionDoc is the document of `osb version`.
type versionDoc struct {
	Client clientVersionView  `json:"client"`
	Server *serverVersionView `json:"server"`
}

type clientVersionView struct {
	Version string `json:"version"`
}

// serverVersionView is what the server's /health said; Version is nil
// when the server does not report one.
type serverVersionView struct {
	Version *string `json:"version"`
	URL     string  `json:"url"`
	Status  string  `json:"status"`
}

func (a *app) versionCommand() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "version",
		Short: "Show the versions of osb and of the server",
		Long: `Show osb's version and the version the server reports on /health.

If the server cannot be reached, osb's version is still printed, the
failure is reported on stderr and the exit code is 1. (osb --version
prints osb's version alone, without asking the server.)`,
		Example: `  osb version
  osb version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			doc := versionDoc{Client: clientVersionView{clientVersion()}}
			p := a.printerFor(f)
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			url := strings.TrimSuffix(c.BaseURL(), "/v1")
			h, herr := c.Health(cmd.Context())
			if herr == nil {
				doc.Server = &serverVersionView{URL: url, Status: h.Status}
				if h.Version != "" {
					doc.Server.Version = &h.Version
				}
			}
			if err := p.doc(doc, func() {
				fmt.Fprintln(p.out, "osb version "+doc.Client.Version)
				if doc.Server != nil {
					v := "unknown (the server does not report one)"
					if doc.Server.Version != nil {
						v = *doc.Server.Version
					}
					fmt.Fprintf(p.out, "server version %s (at %s)\n", v, doc.Server.URL)
				}
			}); err != nil {
				return err
			}
			var ne *sdk.NetworkError
			switch {
			case errors.As(herr, &ne):
				return fmt.Errorf("the server at %s is unreachable: %v", url, ne.Err)
			case herr != nil:
				return fmt.Errorf("the server at %s did not answer /health: %w", url, herr)
			}
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}
