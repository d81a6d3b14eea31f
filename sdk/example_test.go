package sdk_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/sdk"
)

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// Create a sandbox, run a command in it and kill it.
func Example() {
	ctx := context.Background()
	client, err := sdk.NewClientFromEnv() // OPEN_SANDBOX_DOMAIN, OPEN_SANDBOX_API_KEY, ...
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	sb, err := client.Create(ctx, sdk.CreateOptions{Image: "opensandbox/python:3.11", Timeout: 5 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(ctx)

	res, err := sb.Run(ctx, "python3 -c 'print(6 * 7)'", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	fmt.Println("exit code", res.ExitCode)
	// Output:
	// 42
	// exit code 0
}

// Output streams to writers as it is produced; a failing command reports
// its exit code rather than an error.
func ExampleSandbox_Run() {
	ctx := context.Background()
	client, _ := sdk.NewClientFromEnv()
	sb, err := client.Create(ctx, sdk.CreateOptions{Image: "opensandbox/busybox"})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(ctx)

	res, err := sb.Run(ctx, "echo working in $PWD; exit 3", &sdk.RunOptions{
		Cwd:    "/tmp",
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", res.ExitCode)
	// Output:
	// working in /tmp
	// exit code 3
}

// A session keeps shell state between runs.
func ExampleSession() {
	ctx := context.Background()
	client, _ := sdk.NewClientFromEnv()
	sb, err := client.Create(ctx, sdk.CreateOptions{Image: "opensandbox/python:3.11"})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(ctx)

	sess, err := sb.CreateSession(ctx, "/tmp")
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Delete(ctx)
	sess.Run(ctx, "greeting=hello; cd /etc", nil)
	res, _ := sess.Run(ctx, "echo $greeting from $PWD", nil)
	fmt.Print(res.Stdout)
	// Output: hello from /etc
}

// Files go in and out as streams; WriteFile and ReadFile are the short
// forms.
func ExampleSandbox_WriteFile() {
	ctx := context.Background()
	client, _ := sdk.NewClientFromEnv()
	sb, err := client.Create(ctx, sdk.CreateOptions{Image: "opensandbox/busybox"})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(ctx)

	if err := sb.WriteFile(ctx, "/tmp/notes/hello.txt", []byte("hi there\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	data, _ := sb.ReadFile(ctx, "/tmp/notes/hello.txt")
	info, _ := sb.Stat(ctx, "/tmp/notes/hello.txt")
	fmt.Printf("%s%d bytes, mode %d\n", data, info["/tmp/notes/hello.txt"].Size, info["/tmp/notes/hello.txt"].Mode)
	// Output:
	// hi there
	// 9 bytes, mode 644
}

// List iterates over every sandbox that matches, page after page.
func ExampleClient_All() {
	ctx := context.Background()
	client, _ := sdk.NewClientFromEnv()
	for range 3 {
		sb, err := client.Create(ctx, sdk.CreateOptions{Image: "opensandbox/busybox", Metadata: map[string]string{"team": "example"}, SkipHealthCheck: true})
		if err != nil {
			log.Fatal(err)
		}
		defer sb.Kill(ctx)
	}
	n := 0
	for sb, err := range client.All(ctx, sdk.ListOptions{Metadata: map[string]string{"team": "example"}, PageSize: 2}) {
		if err != nil {
			log.Fatal(err)
		}
		if strings.HasPrefix(sb.Metadata["team"], "example") {
			n++
		}
	}
	fmt.Println(n, "sandboxes")
	// Output: 3 sandboxes
}
