// Package archive is the codec of the tar streams that copy trees in
// and out of a sandbox: execd's /files/archive routes on one side, the
// SDK's Copy functions and `osb cp` on the other.
//
// Pack walks a tree without following symbolic links and records
// directories, regular files (hard links once), symbolic links, FIFOs and
// devices. Extract writes a stream into a directory opened as an os.Root,
// so no entry, symbolic link or hard link in the stream can reach outside
// it; each regular file is written under a hidden temporary name and
// renamed into place, so a reader never sees half a file and an
// interrupted copy leaves every existing file whole.
//
// The package uses the standard library only.
package archive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Stats counts what a Pack or Extract handled.
type Stats struct {
	Files   int   // regular files
	Dirs    int   // directories
	Links   int   // symbolic and hard links
	Other   int   // FIFOs and devices written; skipped by Extract
	Skipped int   // entries left out: sockets by Pack, special files by Extract
	Bytes   int64 // content bytes of regular files
}

// PackOptions adjusts Pack.
type PackOptions struct {
	// FollowTop packs what src points to when src is a symbolic link,
	// instead of the link itself. Links inside the tree are never followed.
	FollowTop bool
	// Progress, when set, is called with the bytes of file content
	// written so far, after each chunk.
	Progress func(done int64)
}

// copyBufferSize is the size of the buffer file contents move through.
const copyBufferSize = 1 << 20

var buffers = sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}

// Pack writes the file or tree at src to w as a tar stream whose entries
// are named name (for src itself) and name/REL for what a directory holds.
// With name "" a directory's contents are written without an entry for the
// directory itself; a src that is not a directory then takes its own base
// name. Entries come in lexical order, directories before their contents.
//
// A file that changes size while it is read fails the whole stream: the
// archive never holds a file different from what its header says.
func Pack(ctx context.Context, w io.Writer, src, name string, opts PackOptions) (Stats, error) {
	original := src
	p := packer{ctx: ctx, tw: tar.NewWriter(w), links: make(map[fileID]string), progress: opts.Progress}
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	p.buf = *bp

	if opts.FollowTop {
		resolved, err := filepath.EvalSymlinks(src)
		if err != nil {
			return p.stats, err
		}
		src = resolved
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return p.stats, err
	}
	name = strings.Trim(path.Clean("/"+filepath.ToSlash(name)), "/")
	if name == "" && !fi.IsDir() {
		name = filepath.Base(original)
	}
	if err := p.add(src, name, fi); err != nil {
		return p.stats, err
	}
	return p.stats, p.tw.Close()
}

// Measure returns the content bytes Pack would write for src: the sizes
// of its regular files, each hard-linked file once. It is a hint for
// progress reports, as the tree may change before it is packed.
func Measure(src string, followTop bool) (int64, error) {
	if followTop {
		resolved, err := filepath.EvalSymlinks(src)
		if err != nil {
			return 0, err
		}
		src = resolved
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return 0, err
	}
	if !fi.IsDir() {
		if fi.Mode().IsRegular() {
			return fi.Size(), nil
		}
		return 0, nil
	}
	var total int64
	seen := make(map[fileID]bool)
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil // gone since the directory was read
		}
		if st, ok := statOf(fi); ok && st.nlink > 1 {
			id := fileID{st.dev, st.ino}
			if seen[id] {
				return nil
			}
			seen[id] = true
		}
		total += fi.Size()
		return nil
	})
	return total, err
}

type fileID struct{ dev, ino uint64 }

type packer struct {
	ctx   context.Context
	tw    *tar.Writer
	buf   []byte
	links map[fileID]string // first entry name of each multiply linked file
	stats Stats

	progress func(int64)
}

// add writes the entry for the file at p, described by fi, as name, and
// everything below it when it is a directory.
func (p *packer) add(src, name string, fi fs.FileInfo) error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	hdr, err := header(src, name, fi)
	if err != nil {
		return err
	}
	if hdr == nil {
		p.stats.Skipped++
		return nil
	}
	st, ok := statOf(fi)
	if hdr.Typeflag == tar.TypeReg && ok && st.nlink > 1 {
		id := fileID{st.dev, st.ino}
		if first, ok := p.links[id]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
		} else {
			p.links[id] = name
		}
	}
	// A file is opened before its header goes out, so that one that
	// cannot be read fails between entries, not inside one.
	var f *os.File
	if hdr.Typeflag == tar.TypeReg {
		if f, err = os.OpenFile(src, os.O_RDONLY|openFlags, 0); err != nil {
			return err
		}
		defer f.Close()
	}
	if name != "" {
		if err := p.tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write entry %s: %w", name, err)
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if name != "" {
			p.stats.Dirs++
		}
		return p.addDir(src, name)
	case tar.TypeReg:
		p.stats.Files++
		if err := p.copyFile(f, src, hdr); err != nil {
			return fmt.Errorf("%w: %w", ErrCutShort, err)
		}
		return nil
	case tar.TypeSymlink, tar.TypeLink:
		p.stats.Links++
	default:
		p.stats.Other++
	}
	return nil
}

func (p *packer) addDir(dir, name string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		child := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(child)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the directory was read
		}
		if err != nil {
			return err
		}
		childName := e.Name()
		if name != "" {
			childName = name + "/" + e.Name()
		}
		if err := p.add(child, childName, fi); err != nil {
			return err
		}
	}
	return nil
}

// ErrCutShort marks a Pack failure inside an entry: its header is out
// and only part of its content, so nothing more may follow on the stream
// (a reader would take it for the rest of that content).
var ErrCutShort = errors.New("an entry was cut short")

// copyFile writes the content of the regular file f, opened from src,
// which must still be hdr.Size bytes long.
func (p *packer) copyFile(f *os.File, src string, hdr *tar.Header) error {
	var dst io.Writer = p.tw
	if p.progress != nil {
		dst = &progressWriter{w: p.tw, base: p.stats.Bytes, report: p.progress}
	}
	n, err := io.CopyBuffer(dst, io.LimitReader(f, hdr.Size), p.buf)
	p.stats.Bytes += n
	if err != nil {
		return fmt.Errorf("pack %s: %w", src, err)
	}
	if n != hdr.Size {
		return fmt.Errorf("pack %s: file shrank from %d to %d bytes while it was read", src, hdr.Size, n)
	}
	return nil
}

// header describes the file at src as a tar entry named name; nil for
// what tar cannot hold (sockets).
func header(src, name string, fi fs.FileInfo) (*tar.Header, error) {
	m := fi.Mode()
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(m.Perm()),
		ModTime: fi.ModTime().Truncate(time.Second),
		Format:  tar.FormatUnknown,
	}
	if m&fs.ModeSetuid != 0 {
		hdr.Mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		hdr.Mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		hdr.Mode |= 0o1000
	}
	st, ok := statOf(fi)
	if ok {
		hdr.Uid, hdr.Gid = int(st.uid), int(st.gid)
	}
	switch {
	case m.IsRegular():
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
	case m.IsDir():
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case m&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return nil, err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	case m&fs.ModeNamedPipe != 0:
		hdr.Typeflag = tar.TypeFifo
	case m&fs.ModeDevice != 0 && ok && st.hasDev:
		hdr.Typeflag = tar.TypeBlock
		if m&fs.ModeCharDevice != 0 {
			hdr.Typeflag = tar.TypeChar
		}
		hdr.Devmajor, hdr.Devminor = st.major, st.minor
	default:
		return nil, nil
	}
	return hdr, nil
}

// progressWriter reports the running total of bytes written through it,
// starting from base.
type progressWriter struct {
	w      io.Writer
	base   int64
	report func(int64)
}

func (pw *progressWriter) Write(b []byte) (int, error) {
	n, err := pw.w.Write(b)
	pw.base += int64(n)
	pw.report(pw.base)
	return n, err
}
