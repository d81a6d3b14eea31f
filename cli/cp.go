package cli

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/sdk"
)

// copyDoc is the document of `osb cp`.
type copyDoc struct {
	Source      string  `json:"source"`
	Destination string  `json:"destination"`
	Files       int     `json:"files"`
	Dirs        int     `json:"dirs"`
	Links       int     `json:"links"`
	Skipped     int     `json:"skipped"`
	Bytes       int64   `json:"bytes"`
	Seconds     float64 `json:"seconds"`
}

// remotePath splits "ID:PATH"; a path that starts with "/" or ".", or
// has no colon, is local.
func remotePath(arg string) (id, path string, ok bool) {
	if strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return "", arg, false
	}
	id, path, ok = strings.Cut(arg, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", arg, false
	}
	if path == "" {
		path = "."
	}
	return id, path, true
}

// cpCommand is `osb cp`: files and trees in and out of a sandbox.
func (a *app) cpCommand() *cobra.Command {
	var archiveMode, follow, quiet, syncDisk bool
	cmd := formats(&cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between this machine and a sandbox",
		Long: `Copy a file or a directory tree between this machine and a sandbox, as cp -r
and docker cp do. One of SRC and DST is ID:PATH. A relative sandbox path is
relative to the sandbox's working directory.

  - DST is a directory: the source is copied into it.
  - DST does not exist: the source is copied as DST (its parent must exist).
  - SRC ends in "/.": the directory's contents are copied, not the directory.
  - "-" as the local side is a tar stream on stdin or stdout.

Everything moves as one tar stream. Symbolic links are copied as links (-L
follows SRC itself when it is one); files land atomically, and nothing in the
stream can be written outside DST, whatever the sandbox sends. On a terminal
a progress bar shows on stderr.`,
		Example: `  osb cp ./project 3f0c2a4e:/workspace
  osb cp 3f0c2a4e:/workspace/out ./results
  osb cp ./data/. 3f0c2a4e:/data
  osb cp 3f0c2a4e:/var/log - | tar -tv`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			srcID, src, srcRemote := remotePath(args[0])
			dstID, dst, dstRemote := remotePath(args[1])
			switch {
			case srcRemote && dstRemote:
				return usagef(cmd, "copying between two sandboxes is not supported: copy through this machine")
			case !srcRemote && !dstRemote:
				return usagef(cmd, "one of SRC and DST must be a sandbox path, ID:PATH")
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			p := a.printerFor(f)
			var bar *progressBar
			if !quiet && p.errColor {
				bar = newProgressBar(a.Err)
			}
			opts := &sdk.CopyOptions{FollowLinks: follow, PreserveOwner: archiveMode, Sync: syncDisk}
			if bar != nil {
				opts.Progress = bar.update
			}
			start := time.Now()
			var st *sdk.CopyStats
			ctx := cmd.Context()
			switch {
			case dstRemote && src == "-":
				st, err = c.Sandbox(dstID).UploadArchive(ctx, dst, a.In, &sdk.ArchiveOptions{PreserveOwner: archiveMode, Sync: syncDisk})
			case dstRemote:
				st, err = c.Sandbox(dstID).CopyTo(ctx, src, dst, opts)
			case dst == "-":
				st, err = a.copyToStdout(cmd, c.Sandbox(srcID), src, follow)
			default:
				st, err = c.Sandbox(srcID).CopyFrom(ctx, src, dst, opts)
			}
			if bar != nil {
				bar.finish(err == nil)
			}
			if err != nil {
				return err
			}
			doc := copyDoc{Source: args[0], Destination: args[1], Files: st.Files, Dirs: st.Dirs, Links: st.Links,
				Skipped: st.Skipped, Bytes: st.Bytes, Seconds: time.Since(start).Seconds()}
			switch {
			case dst == "-":
				return nil // stdout is the stream
			case f != formatTable:
				return p.doc(doc, nil)
			case p.errColor || a.verbose:
				fmt.Fprintf(a.Err, "Copied %s in %d files (%d directories, %d links) in %s\n",
					byteSize(doc.Bytes), doc.Files, doc.Dirs, doc.Links, time.Since(start).Round(time.Millisecond))
			}
			if st.Skipped > 0 {
				p.warn(fmt.Sprintf("%d special files (FIFOs, devices) were not copied", st.Skipped))
			}
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
	fl := cmd.Flags()
	fl.BoolVarP(&archiveMode, "archive", "a", false, "keep the owners (uid and gid) the files have at the source")
	fl.BoolVarP(&follow, "follow-link", "L", false, "copy what SRC points to when SRC is a symbolic link")
	fl.BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	fl.BoolVar(&syncDisk, "sync", false, "into a sandbox: return once the data is on its disk, not only in its memory")
	return cmd
}

// copyToStdout streams the tar of src to stdout.
func (a *app) copyToStdout(cmd *cobra.Command, sb *sdk.Sandbox, src string, follow bool) (*sdk.CopyStats, error) {
	ar, err := sb.DownloadArchive(cmd.Context(), src, follow, false)
	if err != nil {
		return nil, err
	}
	defer ar.Close()
	// An archive the sandbox could not finish ends with an error where
	// the stream ends (and with a block that makes the tar on the other
	// side of stdout fail too).
	n, err := io.Copy(a.Out, ar)
	if err != nil {
		return nil, fmt.Errorf("copy %s: %w", src, err)
	}
	return &sdk.CopyStats{Bytes: n}, nil
}

// progressBar draws the progress of a copy on one line of a terminal.
type progressBar struct {
	w     io.Writer
	mu    sync.Mutex
	start time.Time
	last  time.Time
	done  int64
	total int64
	drawn bool
}

func newProgressBar(w io.Writer) *progressBar {
	return &progressBar{w: w, start: time.Now(), total: -1}
}

// update records progress and redraws at most ten times a second.
func (b *progressBar) update(done, total int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done, b.total = done, total
	if now := time.Now(); now.Sub(b.last) >= 100*time.Millisecond {
		b.last = now
		b.drawLocked()
	}
}

func (b *progressBar) drawLocked() {
	elapsed := time.Since(b.start).Seconds()
	rate := ""
	if elapsed > 0.2 {
		rate = byteSize(int64(float64(b.done)/elapsed)) + "/s"
	}
	if b.total > 0 {
		frac := min(float64(b.done)/float64(b.total), 1)
		const width = 30
		fill := int(frac * width)
		fmt.Fprintf(b.w, "\r\x1b[K[%s%s] %3.0f%%  %s / %s  %s", strings.Repeat("=", fill), strings.Repeat(" ", width-fill),
			frac*100, byteSize(b.done), byteSize(b.total), rate)
	} else {
		fmt.Fprintf(b.w, "\r\x1b[K%s  %s", byteSize(b.done), rate)
	}
	b.drawn = true
}

// finish draws the final state and ends the line, or clears it after a
// failure.
func (b *progressBar) finish(ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		if b.total > 0 {
			b.done = b.total
		}
		b.drawLocked()
		fmt.Fprintln(b.w)
	} else if b.drawn {
		fmt.Fprint(b.w, "\r\x1b[K")
	}
}

// byteSize writes n bytes in binary units.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
