package warmpool

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// EntrypointError is CheckEntrypoint's answer for an entrypoint that
// could not start: its file is missing, not executable or not a valid
// executable. The sandbox's state is then Failed with reason
// api.ReasonEntrypointFailed and Error() as its message.
type EntrypointError struct {
	// Entrypoint is the command line as execd ran it.
	Entrypoint string
	// Err is execd's error, as it reported it.
	Err string
}

func (e *EntrypointError) Error() string {
	return fmt.Sprintf("the entrypoint %s could not start: %s", e.Entrypoint, e.Err)
}

// entrypointStatusTimeout bounds one question to execd: it answers the
// status from memory.
const entrypointStatusTimeout = 5 * time.Second

// CheckEntrypoint asks execd at baseURL (http://host:port, with token)
// whether the sandbox's entrypoint could start. It returns nil when it
// started, whatever happened to it since, and when there is none (a warm
// sandbox before its claim); an *EntrypointError when it could not start;
// any other error when execd could not be asked or did not answer. execd
// starts the entrypoint before it serves, so the answer is known as soon
// as execd answers at all.
func CheckEntrypoint(ctx context.Context, client *http.Client, baseURL, token string) error {
	ctx, cancel := context.WithTimeout(ctx, entrypointStatusTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/command/status/"+api.EntrypointCommandID, nil)
	if err != nil {
		return err
	}
	req.Header.Set(sandbox.HeaderExecdToken, token)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("ask execd for the entrypoint's status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("execd answered the entrypoint's status with %s", resp.Status)
	}
	var st api.CommandStatus
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return fmt.Errorf("read the entrypoint's status: %w", err)
	}
	if st.StartFailed() {
		return &EntrypointError{Entrypoint: st.Content, Err: st.Error}
	}
	return nil
}
