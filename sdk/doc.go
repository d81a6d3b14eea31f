// Package sdk is the Go client of OpenSandbox: it creates and manages
// sandboxes through a lifecycle server and works inside them through
// their own endpoints — commands with streamed output, bash sessions,
// terminals, files and whole trees, metrics, code interpreters, the
// egress policy and the credential vault.
//
// A Client talks to one server; configure it in code or from the same
// OPEN_SANDBOX_* environment variables as the other OpenSandbox SDKs
// (see ConfigFromEnv). Client.Create returns a *Sandbox once the sandbox
// runs; Client.Sandbox and Client.Connect give handles on existing ones.
//
//	client, err := sdk.NewClientFromEnv()
//	sb, err := client.Create(ctx, sdk.CreateOptions{Image: "python:3.11"})
//	defer sb.Kill(ctx)
//	res, err := sb.Run(ctx, "python3 -c 'print(6*7)'", nil)
//	fmt.Print(res.Stdout) // 42
//
// Every call takes a context. Errors from the server or a sandbox are
// *APIError values, which carry the HTTP status, the error code and the
// server's request id, and match ErrNotFound, ErrConflict and the other
// kinds with errors.Is. A command that exits non-zero is not an error:
// its Execution says how it ended. Idempotent calls are retried with
// backoff after transient failures (Config.Retries); calls that start
// something are never retried. Connections are kept alive and reused.
//
// Stability: the API of this package follows semantic versioning from
// 1.0; until then, names may still change between minor versions. Every
// method is safe for concurrent use unless its documentation says
// otherwise. The package uses only the standard library, the wire types
// of package api and a WebSocket client for terminals.
package sdk
