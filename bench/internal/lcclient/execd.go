package lcclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/opensandbox/opensandbox/api"
)

// Execd is a client for the execd of one sandbox: requests go to Base
// (http://HOST:PORT) with Headers (the token), through HC.
type Execd struct {
	Base    string
	Headers map[string]string
	HC      *http.Client
}

// Execd asks the server for the sandbox's execd endpoint and returns a
// client for it that uses the server's HTTP client.
func (c *Client) Execd(ctx context.Context, id string) (*Execd, error) {
	code, data, err := c.Do(ctx, "GET", "/v1/sandboxes/"+id+"/endpoints/"+ExecdPort, nil)
	if err != nil || code != http.StatusOK {
		return nil, fmt.Errorf("execd endpoint of %s: %d %s %v", id, code, bytes.TrimSpace(data), err)
	}
	var ep api.Endpoint
	if err := json.Unmarshal(data, &ep); err != nil {
		return nil, fmt.Errorf("execd endpoint of %s: %w", id, err)
	}
	return &Execd{Base: "http://" + ep.Endpoint, Headers: ep.Headers, HC: c.HC}, nil
}

// Run asks the server for the sandbox's execd endpoint and runs cmd there
// (see Execd.Command).
func (c *Client) Run(ctx context.Context, id, cmd string) (int64, error) {
	e, err := c.Execd(ctx, id)
	if err != nil {
		return 0, err
	}
	return e.Command(ctx, cmd)
}

// Request builds a request to execd's path with its headers.
func (e *Execd) Request(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.Base+path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range e.Headers {
		req.Header.Set(k, v)
	}
	return req, nil
}

// Command runs cmd in the foreground through execd and consumes its
// event stream to the end. It returns the bytes of output (each line
// with its newline) and fails unless the command completed.
func (e *Execd) Command(ctx context.Context, cmd string) (int64, error) {
	body, _ := json.Marshal(api.RunCommandRequest{Command: cmd})
	req, err := e.Request(ctx, "POST", "/command", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := e.HC.Do(req)
	if err != nil {
		return 0, fmt.Errorf("command %q: %w", cmd, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("command %q: %d %s", cmd, resp.StatusCode, bytes.TrimSpace(data))
	}
	dec := api.NewEventDecoder(resp.Body)
	var n int64
	for {
		ev, err := dec.Next()
		if err != nil {
			return n, fmt.Errorf("command %q: the stream ended without completing: %v", cmd, err)
		}
		switch ev.Type {
		case api.EventStdout, api.EventStderr:
			n += int64(len(ev.Text)) + 1
		case api.EventComplete:
			return n, nil
		case api.EventError:
			return n, fmt.Errorf("command %q: %s %s", cmd, ev.Error.EName, ev.Error.EValue)
		}
	}
}
