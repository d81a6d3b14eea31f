//go:build !linux

package docker

import "errors"

// errNoPins: pins need Linux's mount namespaces and openat2.
var errNoPins = errors.New("host volumes and volume sub paths need the server on Linux")

func pin(root, rel, target string) error { return errNoPins }

func unpin(target string) error { return nil }

func removePins(dir string) error { return nil }

func canPin(dir string) error { return errNoPins }

func engineSeesPins(local bool, pidFile string) error { return errNoPins }

func mkdirBeneath(root, rel string) error { return errNoPins }
