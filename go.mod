module github.com/opensandbox/opensandbox

go 1.26.0

require (
	github.com/bmatcuk/doublestar/v4 v4.10.4
	golang.org/x/sys v0.50.0
)
