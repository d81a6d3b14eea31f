package cli

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/sdk"
)

// completionTimeout bounds the server call behind one completion: a
// shell waiting on a tab press should not hang on a server that is down.
const completionTimeout = 3 * time.Second

// completionPageSize is how many sandboxes or snapshots a completion
// asks for (the server's largest page).
const completionPageSize = 200

// isCompletionCommand reports whether cmd is one of cobra's completion
// commands: `osb completion SHELL` and the hidden __complete that shells
// call on a tab press. They need no resolved settings, and must work with
// a broken configuration file; the completion functions resolve settings
// themselves, once the flags of the line being completed are parsed.
func isCompletionCommand(cmd *cobra.Command) bool {
	switch cmd.Name() {
	case cobra.ShellCompRequestCmd, cobra.ShellCompNoDescRequestCmd:
		return true
	}
	for c := cmd; c.HasParent(); c = c.Parent() {
		if c.Name() == "completion" && !c.Parent().HasParent() {
			return true
		}
	}
	return false
}

// completeSandboxIDs is a cobra.CompletionFunc for commands whose first
// argument is a sandbox id: the ids of the server's sandboxes that start
// with what was typed, each described by its image. Any failure (no
// server, a bad configuration, a timeout) gives no completions and prints
// nothing.
func (a *app) completeSandboxIDs(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return a.sandboxIDCompletions(cmd, nil, toComplete), cobra.ShellCompDirectiveNoFileComp
}

// completeManySandboxIDs is completeSandboxIDs for commands that take
// sandbox ids only (`osb sandbox kill ID...`): every argument is
// completed, leaving out the ids already on the line.
func (a *app) completeManySandboxIDs(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	return a.sandboxIDCompletions(cmd, args, toComplete), cobra.ShellCompDirectiveNoFileComp
}

// completeSnapshotIDs is completeSandboxIDs for snapshot ids, each
// described by its name, or its sandbox when it has none.
func (a *app) completeSnapshotIDs(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, ctx, cancel := a.completionClient(cmd)
	if c == nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	defer cancel()
	res, err := c.ListSnapshots(ctx, sdk.SnapshotListOptions{PageSize: completionPageSize})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, s := range res.Items {
		if strings.HasPrefix(s.ID, toComplete) {
			out = append(out, s.ID+"\t"+first(s.Name, "of "+s.SandboxID)+" ("+s.Status.State+")")
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// sandboxIDCompletions lists the sandbox ids starting with prefix, but
// those in skip, as "ID\tIMAGE".
func (a *app) sandboxIDCompletions(cmd *cobra.Command, skip []string, prefix string) []string {
	c, ctx, cancel := a.completionClient(cmd)
	if c == nil {
		return nil
	}
	defer cancel()
	res, err := c.List(ctx, sdk.ListOptions{PageSize: completionPageSize})
	if err != nil {
		return nil
	}
	var out []string
	for i := range res.Items {
		sb := &res.Items[i]
		if !strings.HasPrefix(sb.ID, prefix) || slices.Contains(skip, sb.ID) {
			continue
		}
		out = append(out, sb.ID+"\t"+first(imageOf(sb), sb.Status.State))
	}
	return out
}

// completionClient resolves the settings with the flags of the line being
// completed and returns a client with a context bounded by
// completionTimeout; a nil client when the settings do not resolve.
func (a *app) completionClient(cmd *cobra.Command) (*sdk.Client, context.Context, context.CancelFunc) {
	if err := a.resolve(cmd); err != nil {
		return nil, nil, nil
	}
	c, err := a.sdkClient()
	if err != nil {
		return nil, nil, nil
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	return c, ctx, cancel
}
