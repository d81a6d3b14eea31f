// Package fsops holds the file system operations behind execd's file API
// that need no HTTP: moves that work across file systems, tree copies that
// keep owners, modes, times and links, atomic rewrites, hidden temporary
// files and directory creation that can be undone.
//
// Errors wrap the underlying *fs.PathError or *os.LinkError, so callers
// classify them with errors.Is (fs.ErrNotExist, fs.ErrExist,
// syscall.ENOSPC, ...). Only execd imports it.
package fsops
