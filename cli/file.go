package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// fileCommand is `osb file`.
func (a *app) fileCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "file",
		Short: "Read, write, move and inspect files in a sandbox",
		Long: `Work on single files and directories of a sandbox. Every command takes
the sandbox ID first. To copy whole trees, use osb cp.`,
	}
	cmd.AddCommand(a.fileCat(), a.fileWrite(), a.fileUpload(), a.fileDownload(),
		a.fileRm(), a.fileMv(), a.fileMkdir(), a.fileRmdir(), a.fileSearch(),
		a.fileInfo(), a.fileChmod(), a.fileReplace())
	return cmd
}

// permFlags are the --mode, --owner and --group flags of the commands
// that set permissions.
type permFlags struct {
	mode, owner, group string
}

// add defines the flags on fl; modeHelp is the help of --mode.
func (pf *permFlags) add(fl *pflag.FlagSet, modeHelp string) {
	fl.StringVar(&pf.mode, "mode", "", modeHelp)
	fl.StringVar(&pf.owner, "owner", "", "owner, a user name or uid")
	fl.StringVar(&pf.group, "group", "", "group, a name or gid")
}

// permission is the permission the flags ask for; a bad --mode is a
// usage error.
func (pf *permFlags) permission(cmd *cobra.Command) (sdk.Permission, error) {
	p := sdk.Permission{Owner: pf.owner, Group: pf.group}
	if pf.mode != "" {
		m, err := parseMode(pf.mode)
		if err != nil {
			return p, usagef(cmd, "--mode: %v", err)
		}
		p.Mode = fileMode(m)
	}
	return p, nil
}

// fileMode turns permission bits as chmod(2) has them (0o4755) into an
// fs.FileMode, whose setuid, setgid and sticky bits live elsewhere.
func fileMode(bits uint32) fs.FileMode {
	m := fs.FileMode(bits & 0o777)
	if bits&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if bits&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if bits&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// fileCat is `osb file cat`.
func (a *app) fileCat() *cobra.Command {
	var offset, limit int64
	cmd := formats(&cobra.Command{
		Use:   "cat ID PATH",
		Short: "Print a file of a sandbox, byte for byte, or some of its lines",
		Long: `Print a file of a sandbox to stdout exactly as it is: no newline is
added and binary content passes unchanged.

--offset N and --limit M print M lines from line N (lines are numbered
from 1), each as it is in the file ("\r\n" stays, and a last line without
a newline gets none). --offset alone prints to the end, --limit alone from
the first line; a window past the end prints nothing. The lines are read
as they stream, however long the file or a line.`,
		Example: `  osb file cat sb-1 /workspace/app.log
  osb file cat sb-1 /workspace/app.log --offset 101 --limit 50`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := a.format(cmd, ""); err != nil {
				return err
			}
			byLines := flagChanged(cmd.Flags(), "offset") || flagChanged(cmd.Flags(), "limit")
			if byLines {
				for _, f := range []struct {
					name string
					v    int64
				}{{"offset", offset}, {"limit", limit}} {
					if flagChanged(cmd.Flags(), f.name) && f.v < 1 {
						return usagef(cmd, "--%s %d: want 1 or more", f.name, f.v)
					}
				}
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			var fr *sdk.FileReader
			if byLines {
				fr, err = sb.DownloadLines(cmd.Context(), args[1], offset, limit)
			} else {
				fr, err = sb.Download(cmd.Context(), args[1])
			}
			if err != nil {
				return err
			}
			defer fr.Close()
			if _, err := io.Copy(a.Out, fr); err != nil {
				return fmt.Errorf("read %s: %w", args[1], err)
			}
			return nil
		},
	}, formatRaw)
	cmd.Flags().Int64Var(&offset, "offset", 0, "the first line to print, counting from 1 (default: the first)")
	cmd.Flags().Int64Var(&limit, "limit", 0, "how many lines to print (default: to the end)")
	return cmd
}

// fileWrite is `osb file write`.
func (a *app) fileWrite() *cobra.Command {
	var (
		content string
		perm    permFlags
	)
	cmd := formats(&cobra.Command{
		Use:   "write ID PATH",
		Short: "Write a file of a sandbox from -c or from stdin",
		Long: `Write a file of a sandbox, replacing it if it exists (atomically: a
reader sees the old content or the new). The content is -c's value, or
without -c all of stdin, byte for byte (binary is fine). Missing parent
directories are created.

Without --mode a new file gets execd's default (0777 less its umask)
and a replaced one keeps its mode.`,
		Example: `  osb file write sb-1 /workspace/hello.txt -c 'hello world'
  tar czf - src | osb file write sb-1 /tmp/src.tgz --mode 600
  osb file write sb-1 /workspace/empty -c ''`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			p, err := perm.permission(cmd)
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			var src io.Reader
			if flagChanged(cmd.Flags(), "content") {
				src = strings.NewReader(content)
			} else {
				if isTerminal(a.In) {
					fmt.Fprintln(a.Err, "Reading from stdin (Ctrl-D to finish):")
				}
				src = a.In
			}
			err = sb.Upload(cmd.Context(), sdk.UploadFile{Path: args[1], Content: src, Mode: p.Mode, Owner: p.Owner, Group: p.Group})
			if err != nil {
				return err
			}
			a.printerFor(f).success("Written: " + args[1])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().StringVarP(&content, "content", "c", "", `the content to write (default: read stdin; -c "" writes an empty file)`)
	perm.add(cmd.Flags(), "permission bits in octal, such as 644 or 0755")
	return cmd
}

// fileUpload is `osb file upload`.
func (a *app) fileUpload() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "upload ID LOCAL_PATH REMOTE_PATH",
		Short: "Copy a local file into a sandbox",
		Long: `Copy a local file into a sandbox, streaming it (any size, binary safe).
The remote file gets the local file's permission bits; missing parent
directories are created. For directories, use osb cp.`,
		Example: `  osb file upload sb-1 ./model.bin /workspace/model.bin`,
		Args:    cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			local, remote := args[1], args[2]
			src, err := os.Open(local)
			if err != nil {
				return fmt.Errorf("local file: %w", err)
			}
			defer src.Close()
			info, err := src.Stat()
			if err != nil {
				return fmt.Errorf("local file: %w", err)
			}
			if info.IsDir() {
				return fmt.Errorf("%s is a directory: use osb cp to copy directories", local)
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			if err := sb.Upload(cmd.Context(), sdk.UploadFile{Path: remote, Content: src, Mode: info.Mode().Perm()}); err != nil {
				return err
			}
			a.printerFor(f).success("Uploaded: " + local + " → " + remote)
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}

// fileDownload is `osb file download`.
func (a *app) fileDownload() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "download ID REMOTE_PATH LOCAL_PATH",
		Short: "Copy a file of a sandbox to a local path, or to stdout with -",
		Long: `Copy a file of a sandbox to a local file, streaming it (any size, binary
safe). LOCAL_PATH "-" (or the file that is stdout, like /dev/stdout)
writes the bytes to stdout and nothing else.

The file is written under a temporary name next to LOCAL_PATH and
renamed into place once complete, so a failed or interrupted download
never leaves a partial file and leaves an existing one untouched; an
existing file keeps its permission bits. Missing parent directories are
created. A special file such as /dev/null or a FIFO is written directly.`,
		Example: `  osb file download sb-1 /workspace/out.csv ./results/out.csv
  osb file download sb-1 /workspace/out.csv - | head`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			remote, local := args[1], args[2]
			toStdout, err := a.download(cmd.Context(), sb, remote, local)
			if err != nil {
				return err
			}
			if !toStdout {
				a.printerFor(f).success("Downloaded: " + remote + " → " + local)
			}
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}

// download copies remote to local as the download command's help says,
// and reports whether local was stdout.
func (a *app) download(ctx context.Context, sb *sdk.Sandbox, remote, local string) (toStdout bool, err error) {
	if local == "-" {
		return true, a.copyRemote(ctx, sb, remote, a.Out)
	}
	info, err := os.Stat(local) // follows symbolic links
	if errors.Is(err, fs.ErrNotExist) {
		return false, a.downloadAtomic(ctx, sb, remote, local, nil)
	} else if err != nil {
		return false, err
	}
	// The file that is stdout (/dev/stdout, /dev/fd/1) is written through
	// stdout, whatever it is, so a redirection's offset and append mode
	// hold.
	if out, ok := a.Out.(*os.File); ok {
		if oi, err := out.Stat(); err == nil && os.SameFile(info, oi) {
			return true, a.copyRemote(ctx, sb, remote, a.Out)
		}
	}
	switch {
	case info.IsDir():
		return false, fmt.Errorf("%s is a directory: give the path of a file", local)
	case info.Mode().IsRegular():
		target, err := filepath.EvalSymlinks(local)
		if err != nil {
			return false, err
		}
		// A file that cannot be written fails now, not after the
		// download.
		w, err := os.OpenFile(target, os.O_WRONLY, 0)
		if err != nil {
			return false, err
		}
		w.Close()
		return false, a.downloadAtomic(ctx, sb, remote, target, info)
	}
	// A device or a FIFO is written directly.
	w, err := os.OpenFile(local, os.O_WRONLY, 0)
	if err != nil {
		return false, err
	}
	err = a.copyRemote(ctx, sb, remote, w)
	if cerr := w.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("write %s: %w", local, cerr)
	}
	return false, err
}

// copyRemote streams a file of the sandbox into w.
func (a *app) copyRemote(ctx context.Context, sb *sdk.Sandbox, remote string, w io.Writer) error {
	fr, err := sb.Download(ctx, remote)
	if err != nil {
		return err
	}
	defer fr.Close()
	if _, err := io.Copy(w, fr); err != nil {
		return fmt.Errorf("download %s: %w", remote, err)
	}
	return nil
}

// downloadAtomic streams remote into a new temporary file beside local
// and renames it over local once complete; on any failure the temporary
// file is removed and local is untouched. old describes the file local
// replaces, nil for none; its permission bits are kept.
func (a *app) downloadAtomic(ctx context.Context, sb *sdk.Sandbox, remote, local string, old fs.FileInfo) (retErr error) {
	// Open the remote file first, so that a missing one leaves no trace,
	// not even the parent directories.
	fr, err := sb.Download(ctx, remote)
	if err != nil {
		return err
	}
	defer fr.Close()
	dir := filepath.Dir(local)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fmt.Errorf("create directory for %s: %w", local, err)
	}
	tmp, err := createTemp(dir, ".osb-download-")
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, fr); err != nil {
		return fmt.Errorf("download %s: %w", remote, err)
	}
	if old != nil {
		if err := tmp.Chmod(old.Mode().Perm()); err != nil {
			return fmt.Errorf("keep the mode of %s: %w", local, err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), local); err != nil {
		return fmt.Errorf("download %s: %w", remote, err)
	}
	return nil
}

// createTemp creates a new file in dir named prefix and random hex, with
// the mode a new file gets (0666 less the umask), unlike os.CreateTemp.
func createTemp(dir, prefix string) (*os.File, error) {
	for range 10 {
		b := make([]byte, 8)
		rand.Read(b)
		f, err := os.OpenFile(filepath.Join(dir, prefix+hex.EncodeToString(b)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, fmt.Errorf("create a temporary file in %s: too many collisions", dir)
}

// pathRow is a row of the commands that act on several paths.
type pathRow struct {
	Path   string `json:"path"`
	Status string `json:"status"`
}

// printPathRows prints rows as a list or a table titled title.
func (a *app) printPathRows(f, title string, paths []string, status string) error {
	rows := make([]pathRow, len(paths))
	table := make([][]string, len(paths))
	for i, p := range paths {
		rows[i] = pathRow{p, status}
		table[i] = []string{p, status}
	}
	p := a.printerFor(f)
	return p.doc(rows, func() { p.table(title, []string{"PATH", "STATUS"}, table, "", nil) })
}

// fileRm is `osb file rm`.
func (a *app) fileRm() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "rm ID PATH...",
		Short: "Delete files (missing ones are fine; directories need rmdir)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			if err := sb.Remove(cmd.Context(), args[1:]...); err != nil {
				return err
			}
			return a.printPathRows(f, "Deleted Files", args[1:], "deleted")
		},
	}, formatTable, formatJSON, formatYAML)
}

// fileMv is `osb file mv`.
func (a *app) fileMv() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "mv ID SOURCE DESTINATION",
		Short: "Move or rename a file or directory (DESTINATION must not exist)",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			if err := sb.Move(cmd.Context(), args[1], args[2]); err != nil {
				return err
			}
			a.printerFor(f).success("Moved: " + args[1] + " → " + args[2])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}

// fileMkdir is `osb file mkdir`.
func (a *app) fileMkdir() *cobra.Command {
	var perm permFlags
	cmd := formats(&cobra.Command{
		Use:   "mkdir ID PATH...",
		Short: "Create directories with their parents (mkdir -p)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			p, err := perm.permission(cmd)
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			if err := sb.Mkdir(cmd.Context(), p, args[1:]...); err != nil {
				return err
			}
			return a.printPathRows(f, "Created Directories", args[1:], "created")
		},
	}, formatTable, formatJSON, formatYAML)
	perm.add(cmd.Flags(), "permission bits in octal for every PATH, such as 755 (default: 0777 less execd's umask)")
	return cmd
}

// fileRmdir is `osb file rmdir`.
func (a *app) fileRmdir() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "rmdir ID PATH...",
		Short: "Delete directories and everything in them (rm -rf)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			if err := sb.RemoveDir(cmd.Context(), args[1:]...); err != nil {
				return err
			}
			return a.printPathRows(f, "Removed Directories", args[1:], "removed")
		},
	}, formatTable, formatJSON, formatYAML)
}

// fileEntry is a file as `osb file info` and `osb file search` print it.
type fileEntry struct {
	Path       string    `json:"path"`
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	Mode       int       `json:"mode"` // octal digits: 644
	Owner      string    `json:"owner"`
	Group      string    `json:"group"`
	CreatedAt  time.Time `json:"created_at"`
	ModifiedAt time.Time `json:"modified_at"`
}

// viewFile is fi as osb prints it, times in UTC.
func viewFile(fi api.FileInfo) fileEntry {
	return fileEntry{Path: fi.Path, Type: fi.Type, Size: fi.Size, Mode: fi.Mode, Owner: fi.Owner, Group: fi.Group,
		CreatedAt: fi.CreatedAt.UTC(), ModifiedAt: fi.ModifiedAt.UTC()}
}

// modeText writes mode digits as ls would: at least three digits.
func modeText(mode int) string { return fmt.Sprintf("%03d", mode) }

// fileSearch is `osb file search`.
func (a *app) fileSearch() *cobra.Command {
	var pattern string
	cmd := formats(&cobra.Command{
		Use:   "search ID DIR --pattern GLOB",
		Short: "Find files under a directory whose name matches a glob",
		Long: `Find the files (not directories) under DIR, at any depth, whose name
matches GLOB, such as "*.py"; a GLOB with "/" matches the path relative
to DIR, and "**" crosses directories.`,
		Example: `  osb file search sb-1 /workspace -p '*.py'
  osb file search sb-1 /workspace -p 'src/**/*_test.go' -o json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			found, err := sb.Search(cmd.Context(), args[1], pattern)
			if err != nil {
				return err
			}
			docs := make([]fileEntry, len(found))
			rows := make([][]string, len(found))
			for i, fi := range found {
				docs[i] = viewFile(fi)
				rows[i] = []string{fi.Path, fmt.Sprint(fi.Size), modeText(fi.Mode), fi.Owner, timeText(&docs[i].ModifiedAt)}
			}
			p := a.printerFor(f)
			return p.doc(docs, func() {
				p.table("Search Results", []string{"PATH", "SIZE", "MODE", "OWNER", "MODIFIED_AT"}, rows, "No files found.", nil)
			})
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().StringVarP(&pattern, "pattern", "p", "", `glob of the names to find, such as "*.log"`)
	cmd.MarkFlagRequired("pattern")
	return cmd
}

// fileInfo is `osb file info`.
func (a *app) fileInfo() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "info ID PATH...",
		Short: "Describe files and directories (symbolic links are described, not followed)",
		Long: `Describe files and directories: type, size, mode (octal digits, such as
644), owner, group and times, in the order of the PATHs. A missing PATH
fails the whole command.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			infos, err := sb.Stat(cmd.Context(), args[1:]...)
			if err != nil {
				return err
			}
			var docs []fileEntry
			var rows [][]string
			for _, path := range args[1:] {
				fi, ok := infos[path]
				if !ok {
					return fmt.Errorf("stat %s: the sandbox did not describe it", path)
				}
				d := viewFile(fi)
				docs = append(docs, d)
				rows = append(rows, []string{d.Path, d.Type, fmt.Sprint(d.Size), modeText(d.Mode), d.Owner, d.Group,
					timeText(&d.CreatedAt), timeText(&d.ModifiedAt)})
			}
			p := a.printerFor(f)
			return p.doc(docs, func() {
				p.table("Path Info", []string{"PATH", "TYPE", "SIZE", "MODE", "OWNER", "GROUP", "CREATED_AT", "MODIFIED_AT"}, rows, "", nil)
			})
		},
	}, formatTable, formatJSON, formatYAML)
}

// fileChmod is `osb file chmod`.
func (a *app) fileChmod() *cobra.Command {
	var perm permFlags
	cmd := formats(&cobra.Command{
		Use:   "chmod ID PATH --mode MODE",
		Short: "Set the mode, and optionally the owner and group, of a file or directory",
		Example: `  osb file chmod sb-1 /workspace/run.sh --mode 755
  osb file chmod sb-1 /workspace/data --mode 0750 --owner app --group app`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			p, err := perm.permission(cmd)
			if err != nil {
				return err
			}
			if p.Mode == 0 {
				return usagef(cmd, "--mode %s: execd cannot set a mode of 0", perm.mode)
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			if err := sb.Chmod(cmd.Context(), args[1], p); err != nil {
				return err
			}
			a.printerFor(f).success("Permissions set: " + args[1])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
	perm.add(cmd.Flags(), "permission bits in octal, such as 644 or 0755")
	cmd.MarkFlagRequired("mode")
	return cmd
}

// replaceDoc is the document of `osb file replace`: a status message,
// as the other CLIs print, with the count.
type replaceDoc struct {
	Status        string `json:"status"`
	Message       string `json:"message"`
	Path          string `json:"path"`
	ReplacedCount int    `json:"replaced_count"`
}

// fileReplace is `osb file replace`.
func (a *app) fileReplace() *cobra.Command {
	var old, repl string
	cmd := formats(&cobra.Command{
		Use:   "replace ID PATH --old TEXT --new TEXT",
		Short: "Replace every occurrence of a text in a file",
		Example: `  osb file replace sb-1 /workspace/app.conf --old 'debug = false' --new 'debug = true'
  osb file replace sb-1 /workspace/notes.txt --old 'TODO ' --new ''`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if old == "" {
				return usagef(cmd, "--old must not be empty")
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			n, err := sb.Replace(cmd.Context(), args[1], old, repl)
			if err != nil {
				return err
			}
			doc := replaceDoc{Status: "ok", Path: args[1], ReplacedCount: n,
				Message: fmt.Sprintf("Replaced %d occurrence%s in: %s", n, plural(n), args[1])}
			p := a.printerFor(f)
			return p.doc(doc, func() { p.success(doc.Message) })
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().StringVar(&old, "old", "", "the text to replace")
	cmd.Flags().StringVar(&repl, "new", "", `the text to put in its place ("" deletes it)`)
	cmd.MarkFlagRequired("old")
	cmd.MarkFlagRequired("new")
	return cmd
}

// plural is "s" unless n is 1.
func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
