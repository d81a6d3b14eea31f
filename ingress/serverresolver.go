package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// ServerResolver finds sandboxes by asking the lifecycle server
// (GET api.IngressTargetsPath) and asks it for renew-on-access
// (POST api.IngressRenewPath), with the server's API key. It is the
// Resolver and Renewer of gateways in front of a Docker server.
type ServerResolver struct {
	base   string // scheme://host[:port][/prefix], no trailing slash
	apiKey string
	client *http.Client
}

var (
	_ Resolver = (*ServerResolver)(nil)
	_ Renewer  = (*ServerResolver)(nil)
)

// serverClient is the default client of ServerResolver: short timeouts
// (the server answers from memory), no proxy from the environment.
var serverClient = &http.Client{
	Timeout: 10 * time.Second,
	Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	},
}

// maxTargetBody bounds the server's answer.
const maxTargetBody = 1 << 20

// NewServerResolver returns a resolver that asks the lifecycle server at
// serverURL (http or https, e.g. "http://127.0.0.1:8080"), sending
// apiKey when it is not empty. client nil uses a default client.
func NewServerResolver(serverURL, apiKey string, client *http.Client) (*ServerResolver, error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("lifecycle server URL %q: want http://host:port or https://host:port", serverURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("lifecycle server URL %q: no query or fragment", serverURL)
	}
	base := strings.TrimSuffix(u.String(), "/")
	base = strings.TrimSuffix(base, "/v1") // the paths carry /v1
	if client == nil {
		client = serverClient
	}
	return &ServerResolver{base: base, apiKey: apiKey, client: client}, nil
}

// Target asks the server where id's port is. A 404 for the sandbox is
// ErrNotFound; anything else that is not an answer is an error.
func (s *ServerResolver) Target(ctx context.Context, id string, port int) (api.IngressTarget, error) {
	var t api.IngressTarget
	u := s.base + api.IngressTargetsPath + url.PathEscape(id) + "/" + strconv.Itoa(port)
	resp, err := s.do(ctx, http.MethodGet, u, nil)
	if err != nil {
		return t, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTargetBody))
	if err != nil {
		return t, fmt.Errorf("read ingress target from the lifecycle server: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return t, answerError(resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, &t); err != nil {
		return t, fmt.Errorf("decode ingress target from the lifecycle server: %w", err)
	}
	return t, nil
}

// Renew asks the server for a renew-on-access of id; the server decides
// whether the expiry moves.
func (s *ServerResolver) Renew(ctx context.Context, id string, port int) error {
	body, _ := json.Marshal(api.IngressRenewRequest{Port: port})
	resp, err := s.do(ctx, http.MethodPost, s.base+api.IngressRenewPath+url.PathEscape(id), body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxTargetBody))
	if resp.StatusCode/100 != 2 {
		return answerError(resp.StatusCode, b)
	}
	return nil
}

func (s *ServerResolver) do(ctx context.Context, method, u string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if s.apiKey != "" {
		req.Header.Set(api.HeaderAPIKey, s.apiKey)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask the lifecycle server: %w", err)
	}
	return resp, nil
}

// answerError turns a server's error answer into an error: a sandbox
// the server does not know is ErrNotFound; a 404 of another kind (a
// server without the ingress routes) is not.
func answerError(status int, body []byte) error {
	var e api.ErrorResponse
	_ = json.Unmarshal(body, &e)
	if status == http.StatusNotFound && strings.HasSuffix(e.Code, "SANDBOX_NOT_FOUND") {
		return fmt.Errorf("%s: %w", e.Message, ErrNotFound)
	}
	if e.Code != "" {
		return fmt.Errorf("lifecycle server answered %d %s: %s", status, e.Code, e.Message)
	}
	return fmt.Errorf("lifecycle server answered %d: %s", status, truncate(strings.TrimSpace(string(body)), 200))
}
