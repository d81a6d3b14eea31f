// Package api holds the wire types and stream framing of the OpenSandbox
// lifecycle, execd and egress APIs. The types mirror the published JSON,
// field names and odd encodings included, so that existing OpenSandbox
// clients interoperate unchanged; domain logic lives elsewhere.
//
// Package api imports only the standard library, and any package of this
// module may import it.
package api
