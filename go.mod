module github.com/opensandbox/opensandbox

go 1.26.0

require (
	github.com/bmatcuk/doublestar/v4 v4.10.4
	github.com/coder/websocket v1.8.15
	github.com/creack/pty v1.1.24
	golang.org/x/sys v0.50.0
)
