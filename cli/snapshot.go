package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// snapshotView is a snapshot as osb prints it, in the snake_case field
// names of the other OpenSandbox CLIs.
type snapshotView struct {
	ID        string     `json:"id"`
	SandboxID string     `json:"sandbox_id"`
	Name      *string    `json:"name"`
	Status    statusView `json:"status"`
	CreatedAt time.Time  `json:"created_at"`
}

func viewSnapshot(s *api.Snapshot) snapshotView {
	return snapshotView{
		ID:        s.ID,
		SandboxID: s.SandboxID,
		Name:      optional(s.Name),
		Status: statusView{State: s.Status.State, Reason: optional(s.Status.Reason),
			Message: optional(s.Status.Message), LastTransitionAt: s.Status.LastTransitionAt},
		CreatedAt: s.CreatedAt,
	}
}

// snapshotCommand is `osb snapshot`.
func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snap"},
		Short:   "Capture sandboxes' file systems and create sandboxes from them",
		Long: `A snapshot captures a sandbox's file system. It is made in the
background: it starts Creating and becomes Ready (or Failed). A Ready
snapshot is the starting point of new sandboxes:

  osb sandbox create --snapshot-id SNAPSHOT_ID`,
	}
	cmd.AddCommand(a.snapshotCreate(), a.snapshotGet(), a.snapshotList(), a.snapshotDelete())
	return cmd
}

// snapshotCreateDoc is the document of `osb snapshot create`.
type snapshotCreateDoc struct {
	ID        string  `json:"id"`
	SandboxID string  `json:"sandbox_id"`
	Name      *string `json:"name"`
	Status    string  `json:"status"`
}

func (a *app) snapshotCreate() *cobra.Command {
	var (
		name    string
		wait    bool
		waitMax time.Duration
	)
	cmd := formats(&cobra.Command{
		Use:   "create ID",
		Short: "Snapshot a sandbox's file system",
		Long: `Start a snapshot of sandbox ID's file system and print it. Without --wait
it is printed at once, normally Creating; with --wait osb waits until it
is Ready, and fails (exit 1) if it fails or --wait-timeout passes.`,
		Example: `  osb snapshot create sb-123 --name before-upgrade
  osb snapshot create sb-123 --wait -o json`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeSandboxIDs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("name") && name == "" {
				return usagef(cmd, "--name must not be empty")
			}
			if waitMax <= 0 {
				return usagef(cmd, "--wait-timeout must be positive")
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			snap, err := c.CreateSnapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			if wait {
				ctx, cancel := context.WithTimeout(cmd.Context(), waitMax)
				defer cancel()
				ready, err := c.WaitSnapshot(ctx, snap.ID)
				if err != nil {
					if ctx.Err() != nil && cmd.Context().Err() == nil {
						return fmt.Errorf("snapshot %s is not Ready after %v; osb snapshot get %s shows how it goes on", snap.ID, waitMax, snap.ID)
					}
					return err
				}
				snap = ready
			}
			doc := snapshotCreateDoc{ID: snap.ID, SandboxID: snap.SandboxID, Name: optional(snap.Name), Status: snap.Status.State}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				p.kv("Snapshot Created", [][2]string{{"id", doc.ID}, {"sandbox_id", doc.SandboxID}, {"name", snap.Name}, {"status", p.state(doc.Status)}})
			})
		},
	}, formatTable, formatJSON, formatYAML)
	fl := cmd.Flags()
	fl.StringVar(&name, "name", "", "name of the snapshot")
	fl.BoolVar(&wait, "wait", false, "wait until the snapshot is Ready")
	waitMax = 10 * time.Minute
	fl.Var(&durationValue{d: &waitMax}, "wait-timeout", "how long --wait waits")
	return cmd
}

func (a *app) snapshotGet() *cobra.Command {
	return formats(&cobra.Command{
		Use:               "get SNAPSHOT_ID",
		Short:             "Show a snapshot",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeSnapshotIDs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			snap, err := c.GetSnapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			p := a.printerFor(f)
			return p.doc(viewSnapshot(snap), func() {
				pairs := [][2]string{
					{"id", snap.ID},
					{"sandbox_id", snap.SandboxID},
					{"name", snap.Name},
					{"status", p.state(snap.Status.State)},
					{"created_at", timeText(&snap.CreatedAt)},
				}
				if snap.Status.Reason != "" {
					pairs = append(pairs, [2]string{"status_reason", snap.Status.Reason})
				}
				if snap.Status.Message != "" {
					pairs = append(pairs, [2]string{"status_message", snap.Status.Message})
				}
				p.kv("Snapshot Info", pairs)
			})
		},
	}, formatTable, formatJSON, formatYAML)
}

// snapshotListDoc is the document of `osb snapshot list`.
type snapshotListDoc struct {
	Items      []snapshotView `json:"items"`
	Pagination pageView       `json:"pagination"`
}

func (a *app) snapshotList() *cobra.Command {
	var (
		sandboxID      string
		states         []string
		page, pageSize int
	)
	cmd := formats(&cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List snapshots, newest first",
		Example: `  osb snapshot list --sandbox-id sb-123
  osb snapshot list --state Ready --state Creating -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if (cmd.Flags().Changed("page") && page < 1) || (cmd.Flags().Changed("page-size") && pageSize < 1) {
				return usagef(cmd, "--page and --page-size must be at least 1")
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			res, err := c.ListSnapshots(cmd.Context(), sdk.SnapshotListOptions{SandboxID: sandboxID, States: states, Page: page, PageSize: pageSize})
			if err != nil {
				return err
			}
			pg := res.Pagination
			doc := snapshotListDoc{Items: make([]snapshotView, 0, len(res.Items)),
				Pagination: pageView{pg.Page, pg.PageSize, pg.TotalItems, pg.TotalPages, pg.HasNextPage}}
			rows := make([][]string, 0, len(res.Items))
			for i := range res.Items {
				s := &res.Items[i]
				doc.Items = append(doc.Items, viewSnapshot(s))
				rows = append(rows, []string{s.ID, s.Name, s.SandboxID, s.Status.State, timeText(&s.CreatedAt)})
			}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				p.table("Snapshots", []string{"ID", "NAME", "SANDBOX_ID", "STATUS", "CREATED_AT"}, rows, "No snapshots found.",
					func(col int, cell string) string {
						if col == 3 {
							return p.state(cell)
						}
						return cell
					})
				if pg.HasNextPage {
					p.info(fmt.Sprintf("Page %d of %d (%d snapshots); --page %d for more.", pg.Page, pg.TotalPages, pg.TotalItems, pg.Page+1))
				}
			})
		},
	}, formatTable, formatJSON, formatYAML)
	fl := cmd.Flags()
	fl.StringVar(&sandboxID, "sandbox-id", "", "keep the snapshots of this sandbox")
	fl.StringArrayVar(&states, "state", nil, "keep snapshots in this state: Creating, Ready, Failed or Deleting (repeatable: any of them; any case)")
	fl.IntVar(&page, "page", 0, "page number, from 1")
	fl.IntVar(&pageSize, "page-size", 0, "snapshots per page (at most 200)")
	cmd.RegisterFlagCompletionFunc("sandbox-id", a.completeSandboxIDs)
	return cmd
}

func (a *app) snapshotDelete() *cobra.Command {
	return formats(&cobra.Command{
		Use:               "delete SNAPSHOT_ID",
		Aliases:           []string{"rm"},
		Short:             "Delete a snapshot; sandboxes made from it live on",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeSnapshotIDs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			if err := c.DeleteSnapshot(cmd.Context(), args[0]); err != nil {
				return err
			}
			a.printerFor(f).success("Snapshot deleted: " + args[0])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}
