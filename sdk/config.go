package sdk

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// The environment variables ConfigFromEnv reads, shared with the other
// OpenSandbox SDKs and the osb CLI.
const (
	EnvDomain         = "OPEN_SANDBOX_DOMAIN"
	EnvAPIKey         = "OPEN_SANDBOX_API_KEY"
	EnvProtocol       = "OPEN_SANDBOX_PROTOCOL"
	EnvRequestTimeout = "OPEN_SANDBOX_REQUEST_TIMEOUT"
	EnvUseServerProxy = "OPEN_SANDBOX_USE_SERVER_PROXY"
)

// Defaults of Config.
const (
	DefaultDomain         = "localhost:8080"
	DefaultProtocol       = "http"
	DefaultRequestTimeout = 30 * time.Second
	DefaultRetries        = 3
)

// Config says how a Client reaches a lifecycle server. The zero Config
// talks to http://localhost:8080 without an API key.
type Config struct {
	// Domain is the server as host[:port], or a URL with an http or https
	// scheme (whose scheme then wins over Protocol) and optionally a path
	// prefix. Default DefaultDomain. "/v1" is added unless the path
	// already ends with it.
	Domain string

	// APIKey is sent in OPEN-SANDBOX-API-KEY on every request to the
	// server; never to a sandbox.
	APIKey string

	// Protocol is "http" (the default) or "https". It is also the scheme
	// used to reach a sandbox's endpoints.
	Protocol string

	// RequestTimeout bounds each call that is not a stream: the whole
	// exchange, body included. For calls that stream their answer
	// (command output, downloads) it bounds only the wait for the
	// response headers, and calls that stream their body (uploads) are
	// not bounded by it at all. Default DefaultRequestTimeout; negative
	// means no limit beyond the context's.
	RequestTimeout time.Duration

	// UseServerProxy sends all traffic to a sandbox (commands, files,
	// terminals, the egress API) through the server's proxy route instead
	// of to the sandbox's published ports: for clients that reach the
	// server but not the host the sandboxes run on.
	UseServerProxy bool

	// Retries is how many times an idempotent call (GET, DELETE, and the
	// calls documented as safe to repeat) is retried after a network
	// error or a 429, 502, 503 or 504 answer, with exponential backoff.
	// Default DefaultRetries; negative disables retries. Calls that start
	// something (create, run, upload) are never retried.
	Retries int

	// HTTPClient, when set, carries every request; its Timeout should be
	// zero, as streams last as long as they last. Default: a client of the
	// Client's own with pooled keep-alive connections.
	HTTPClient *http.Client

	// UserAgent is sent as User-Agent. Default "opensandbox-go/VERSION".
	UserAgent string
}

// ConfigFromEnv returns a Config filled from the OPEN_SANDBOX_*
// environment variables; unset variables leave their fields at the
// defaults. OPEN_SANDBOX_REQUEST_TIMEOUT is seconds ("30", "2.5") or a Go
// duration ("1m"); OPEN_SANDBOX_USE_SERVER_PROXY is true/false, 1/0,
// yes/no or on/off. A value that cannot be read is an error naming the
// variable.
func ConfigFromEnv() (Config, error) {
	cfg := Config{
		Domain:   strings.TrimSpace(os.Getenv(EnvDomain)),
		APIKey:   os.Getenv(EnvAPIKey),
		Protocol: strings.ToLower(strings.TrimSpace(os.Getenv(EnvProtocol))),
	}
	if v := strings.TrimSpace(os.Getenv(EnvRequestTimeout)); v != "" {
		d, err := ParseSeconds(v)
		if err != nil {
			return cfg, fmt.Errorf("%s=%q: %w", EnvRequestTimeout, v, err)
		}
		cfg.RequestTimeout = d
	}
	if v := strings.TrimSpace(os.Getenv(EnvUseServerProxy)); v != "" {
		b, ok := ParseBool(v)
		if !ok {
			return cfg, fmt.Errorf("%s=%q: want true or false", EnvUseServerProxy, v)
		}
		cfg.UseServerProxy = b
	}
	return cfg, cfg.validate()
}

// ParseSeconds reads a timeout given as seconds ("30", "2.5") or as a Go
// duration ("1m30s"). It must be positive.
func ParseSeconds(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		d = time.Duration(f * float64(time.Second))
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, fmt.Errorf("want seconds or a duration such as 30s")
	}
	if d <= 0 {
		return 0, fmt.Errorf("must be positive")
	}
	return d, nil
}

// ParseBool reads true/false, 1/0, yes/no and on/off, in any case.
func ParseBool(s string) (value, ok bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "yes", "on":
		return true, true
	case "0", "false", "no", "off":
		return false, true
	}
	return false, false
}

// validate checks the fields that can be wrong.
func (c Config) validate() error {
	switch c.Protocol {
	case "", "http", "https":
	default:
		return fmt.Errorf("protocol %q: want http or https", c.Protocol)
	}
	_, err := c.baseURL()
	return err
}

// protocol is the scheme for the server and the sandboxes' endpoints.
func (c Config) protocol() string {
	if u, err := url.Parse(c.Domain); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		return u.Scheme
	}
	return cmp.Or(c.Protocol, DefaultProtocol)
}

// baseURL is the server's API root, ending in /v1.
func (c Config) baseURL() (*url.URL, error) {
	domain := cmp.Or(c.Domain, DefaultDomain)
	raw := domain
	if !strings.HasPrefix(domain, "http://") && !strings.HasPrefix(domain, "https://") {
		if strings.Contains(domain, "://") {
			return nil, fmt.Errorf("domain %q: want host[:port] or an http(s) URL", domain)
		}
		raw = cmp.Or(c.Protocol, DefaultProtocol) + "://" + domain
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("domain %q: want host[:port] or an http(s) URL", domain)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("domain %q: no query, fragment or user info allowed", domain)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	if !strings.HasSuffix(u.Path, "/v1") {
		u.Path += "/v1"
	}
	u.RawPath = ""
	return u, nil
}
