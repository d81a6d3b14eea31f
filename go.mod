module github.com/opensandbox/opensandbox

go 1.26.0

require (
	github.com/coder/websocket v1.8.15
	github.com/creack/pty v1.1.24
	golang.org/x/sys v0.50.0
)
