package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// fetched is what fetch and ws report, as the JSON text of the result's
// detail.
type fetched struct {
	Status int                 `json:"status"`
	Proto  string              `json:"proto"`
	Header map[string][]string `json:"header"`
	Body   string              `json:"body"`
	// Chunks are the body's reads: when each arrived (ms after the
	// response head) and what it held.
	Chunks []chunk `json:"chunks,omitempty"`
}

type chunk struct {
	AtMS int64  `json:"atMs"`
	Data string `json:"data"`
}

// fetchTLS is the TLS configuration of fetch and ws: verified against the
// system's roots (SSL_CERT_FILE included) unless -cafile names others,
// with the SNI of -sni or the URL's host.
func fetchTLS(o options, host string, protos []string) (*tls.Config, error) {
	if o.caFile != "" {
		cfg, err := tlsConfig(o, host)
		if err != nil {
			return nil, err
		}
		cfg.NextProtos = protos
		return cfg, nil
	}
	name := o.sni
	if name == "" {
		name = host
	}
	return &tls.Config{ServerName: name, NextProtos: protos}, nil
}

// probeFetch sends one request (-method, -data, -header, -host; -h2 asks
// for HTTP/2) and reports the whole response; ok on any status.
func probeFetch(ctx context.Context, rawURL string, o options) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse URL: %w", err)
	}
	protos := []string{"http/1.1"}
	if o.h2 {
		protos = []string{"h2", "http/1.1"}
	}
	cfg, err := fetchTLS(o, u.Hostname(), protos)
	if err != nil {
		return "", err
	}
	tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true, Proxy: nil, ForceAttemptHTTP2: o.h2, DisableCompression: true}
	if !o.h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	var body io.Reader
	if o.data != "" {
		body = strings.NewReader(o.data)
	}
	req, err := http.NewRequestWithContext(ctx, o.method, rawURL, body)
	if err != nil {
		return "", fmt.Errorf("request: %w", err)
	}
	if o.host != "" {
		req.Host = o.host
	}
	for _, h := range o.headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	f := fetched{Status: resp.StatusCode, Proto: resp.Proto, Header: resp.Header}
	start := time.Now()
	buf := make([]byte, 32<<10)
	var all []byte
	for len(all) < 1<<20 {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			all = append(all, buf[:n]...)
			f.Chunks = append(f.Chunks, chunk{AtMS: time.Since(start).Milliseconds(), Data: string(buf[:n])})
		}
		if err == io.EOF {
			break
		} else if err != nil {
			return "", fmt.Errorf("read body: %w", err)
		}
	}
	f.Body = string(all)
	out, err := json.Marshal(f)
	return string(out), err
}

// probeWS opens a WebSocket at a wss:// URL (-header adds headers), sends
// one text message and reports the response head and the first message
// back as the body; ok when the upgrade succeeded and a message came.
func probeWS(ctx context.Context, rawURL string, o options) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "wss" {
		return "", fmt.Errorf("want a wss:// URL, got %q", rawURL)
	}
	cfg, err := fetchTLS(o, u.Hostname(), []string{"http/1.1"})
	if err != nil {
		return "", err
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	key := make([]byte, 16)
	rand.Read(key)
	k := base64.StdEncoding.EncodeToString(key)
	host := u.Host
	if o.host != "" {
		host = o.host
	}
	head := "GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + host + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + k + "\r\n"
	for _, h := range o.headers {
		head += h + "\r\n"
	}
	if _, err := io.WriteString(c, head+"\r\n"); err != nil {
		return "", err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", fmt.Errorf("read the upgrade answer: %w", err)
	}
	f := fetched{Status: resp.StatusCode, Proto: resp.Proto, Header: resp.Header}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		f.Body = string(b)
		out, _ := json.Marshal(f)
		return string(out), errors.New("not upgraded")
	}
	sum := sha1.Sum([]byte(k + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	if resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		return "", errors.New("wrong Sec-WebSocket-Accept")
	}
	if err := writeWSText(c, "hello"); err != nil {
		return "", err
	}
	msg, err := readWSText(br)
	if err != nil {
		return "", err
	}
	f.Body = msg
	out, err := json.Marshal(f)
	return string(out), err
}

// writeWSText sends one masked text frame (short payloads only).
func writeWSText(w io.Writer, s string) error {
	if len(s) > 125 {
		return errors.New("message too long")
	}
	mask := make([]byte, 4)
	rand.Read(mask)
	frame := []byte{0x81, 0x80 | byte(len(s))}
	frame = append(frame, mask...)
	for i := range len(s) {
		frame = append(frame, s[i]^mask[i%4])
	}
	_, err := w.Write(frame)
	return err
}

// readWSText reads one unmasked frame from a server.
func readWSText(r *bufio.Reader) (string, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return "", fmt.Errorf("read a frame: %w", err)
	}
	n := int(h[1] & 0x7f)
	switch n {
	case 126:
		var l [2]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return "", err
		}
		n = int(binary.BigEndian.Uint16(l[:]))
	case 127:
		return "", errors.New("frame too long")
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return "", err
	}
	return string(data), nil
}
