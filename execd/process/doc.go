// Package process supervises the processes execd starts: it forks them into
// their own process groups, collects their exit status (reaping every child
// when execd is init), reads their output pipes without letting leftover
// grandchildren hold a stream open, and keeps output in ring buffers and
// spool files. It serves no HTTP; package execd builds the API on it.
package process
