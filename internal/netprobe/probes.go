package main

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// probeTCP connects to addr, sends a line and reads what comes back
// (the first line, or what arrived before the deadline). A connection
// that is accepted and closed with no reply is not ok: a proxy refusing
// a flow does exactly that.
func probeTCP(ctx context.Context, network, addr string) (string, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	if _, err := io.WriteString(c, "netprobe\n"); err != nil {
		return "connected", fmt.Errorf("send: %w", err)
	}
	var got []byte
	buf := make([]byte, 4096)
	for len(got) < len(buf) && !bytes.Contains(got, []byte("\n")) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			if len(got) > 0 {
				break
			}
			return "connected, no reply", err
		}
	}
	return "reply: " + clip(got), nil
}

// probeUDP sends a datagram to addr and waits for one back, sending again
// every second in case one was lost.
func probeUDP(ctx context.Context, addr string) (string, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "udp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 65535)
	for {
		if _, err := c.Write([]byte("netprobe")); err != nil {
			return "", fmt.Errorf("send: %w", err)
		}
		wait := time.Now().Add(time.Second)
		if d, ok := ctx.Deadline(); ok && d.Before(wait) {
			wait = d
		}
		c.SetReadDeadline(wait)
		n, err := c.Read(buf)
		if err == nil {
			return "reply: " + clip(buf[:n]), nil
		}
		if ctx.Err() != nil {
			return "no reply", err
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return "no reply", err // an ICMP error: nothing listens, or a reject rule
		}
	}
}

// tlsConfig is the client configuration for a server named host: SNI
// -sni (host when unset; none with -nosni, and none when the name is an
// address), verified against -cafile for that name when given.
func tlsConfig(o options, host string) (*tls.Config, error) {
	name := o.sni
	if name == "" {
		name = host
	}
	if o.noSNI {
		name = ""
	}
	cfg := &tls.Config{ServerName: name, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}
	if o.caFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(o.caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in %s", o.caFile)
	}
	cfg.RootCAs = pool // the client verifies an ECH rejection's outer name with these
	verifyAs := name
	if verifyAs == "" {
		verifyAs = host
	}
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		opts := x509.VerifyOptions{Roots: pool, DNSName: verifyAs, Intermediates: x509.NewCertPool()}
		if cs.ECHAccepted || cs.ServerName != "" {
			opts.DNSName = cs.ServerName
		}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(opts)
		return err
	}
	return cfg, nil
}

// probeHTTP sends GET rawURL (http or https) to the URL's own address,
// with Host -host, TLS as tlsConfig says; ok on a 2xx status. Proxies
// from the environment are not used.
func probeHTTP(ctx context.Context, rawURL string, o options) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse URL: %w", err)
	}
	cfg, err := tlsConfig(o, u.Hostname())
	if err != nil {
		return "", err
	}
	tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true, Proxy: nil}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return "", fmt.Errorf("request: %w", err)
	}
	if o.host != "" {
		req.Host = o.host
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	detail := fmt.Sprintf("HTTP %d: %s", resp.StatusCode, clip(body))
	var seen []string
	for k, v := range resp.Header {
		if strings.HasPrefix(k, "X-Standin-") {
			seen = append(seen, strings.ToLower(strings.TrimPrefix(k, "X-Standin-"))+"="+strings.Join(v, ","))
		}
	}
	if len(seen) > 0 {
		sort.Strings(seen)
		detail += " [" + strings.Join(seen, " ") + "]"
	}
	if resp.StatusCode/100 != 2 {
		return detail, errors.New("not a 2xx status")
	}
	return detail, nil
}

// query builds the question for name of type o.qtype.
func query(name string, o options) (*dns.Msg, uint16, error) {
	qtype, ok := dns.StringToType[strings.ToUpper(o.qtype)]
	if !ok {
		return nil, 0, fmt.Errorf("unknown DNS type %q", o.qtype)
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	return q, qtype, nil
}

// answered describes m; it is an error unless m is NOERROR with a record
// of type qtype.
func answered(m *dns.Msg, qtype uint16) (string, error) {
	var rrs []string
	found := false
	for _, rr := range m.Answer {
		h := rr.Header()
		found = found || h.Rrtype == qtype
		rrs = append(rrs, dns.TypeToString[h.Rrtype]+" "+strings.TrimPrefix(rr.String(), h.String()))
	}
	detail := dns.RcodeToString[m.Rcode]
	if len(rrs) > 0 {
		detail += ": " + strings.Join(rrs, ", ")
	}
	if m.Rcode != dns.RcodeSuccess || !found {
		return detail, fmt.Errorf("no %s record", dns.TypeToString[qtype])
	}
	return detail, nil
}

// probeDNS asks -server (the first name server of /etc/resolv.conf when
// unset) for name, over UDP or with -tcp over TCP.
func probeDNS(ctx context.Context, name string, o options) (string, error) {
	q, qtype, err := query(name, o)
	if err != nil {
		return "", err
	}
	server := o.server
	if server == "" {
		conf, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			return "", fmt.Errorf("no -server and no resolv.conf: %w", err)
		}
		if len(conf.Servers) == 0 {
			return "", errors.New("no -server and no name server in resolv.conf")
		}
		server = net.JoinHostPort(conf.Servers[0], conf.Port)
	}
	network := "udp"
	if o.tcp {
		network = "tcp"
	}
	m, _, err := (&dns.Client{Net: network, Timeout: o.timeout}).ExchangeContext(ctx, q, server)
	if err != nil {
		return "", err
	}
	return answered(m, qtype)
}

// probeDoT asks the DNS-over-TLS server at addr for name.
func probeDoT(ctx context.Context, addr, name string, o options) (string, error) {
	q, qtype, err := query(name, o)
	if err != nil {
		return "", err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", addr, err)
	}
	cfg, err := tlsConfig(o, host)
	if err != nil {
		return "", err
	}
	cfg.NextProtos = []string{"dot"}
	m, _, err := (&dns.Client{Net: "tcp-tls", TLSConfig: cfg, Timeout: o.timeout}).ExchangeContext(ctx, q, addr)
	if err != nil {
		return "", err
	}
	return answered(m, qtype)
}

// probeDoH asks the DNS-over-HTTPS endpoint rawURL for name (RFC 8484
// POST).
func probeDoH(ctx context.Context, rawURL, name string, o options) (string, error) {
	q, qtype, err := query(name, o)
	if err != nil {
		return "", err
	}
	wire, err := q.Pack()
	if err != nil {
		return "", fmt.Errorf("pack query: %w", err)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse URL: %w", err)
	}
	cfg, err := tlsConfig(o, u.Hostname())
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rawURL, bytes.NewReader(wire))
	if err != nil {
		return "", fmt.Errorf("request: %w", err)
	}
	req.Header.Set("Content-Type", "application/dns-message")
	req.Header.Set("Accept", "application/dns-message")
	resp, err := (&http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}).RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 65535))
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, clip(body)), errors.New("not a DNS answer")
	}
	m := new(dns.Msg)
	if err := m.Unpack(body); err != nil {
		return "HTTP 200", fmt.Errorf("unpack answer: %w", err)
	}
	return answered(m, qtype)
}

// probeRaw opens a raw ICMP socket and a packet socket, the ways to send
// packets no firewall rule for TCP or UDP sees; both need CAP_NET_RAW.
func probeRaw() (string, error) {
	var parts []string
	ok := false
	for _, s := range []struct {
		what                  string
		domain, typ, protocol int
	}{
		{"raw", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP},
		{"packet", unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL))},
	} {
		fd, err := unix.Socket(s.domain, s.typ|unix.SOCK_CLOEXEC, s.protocol)
		if err != nil {
			parts = append(parts, s.what+": "+err.Error())
			continue
		}
		unix.Close(fd)
		ok = true
		parts = append(parts, s.what+": opened")
	}
	detail := strings.Join(parts, "; ")
	if !ok {
		return "", errors.New(detail)
	}
	return detail, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// probeNft lists the namespace's nftables tables and adds (then removes)
// one of its own; either working means the process can read or change
// the firewall, which needs CAP_NET_ADMIN.
func probeNft() (string, error) {
	c, err := nftables.New()
	if err != nil {
		return "", fmt.Errorf("netlink: %w", err)
	}
	var parts []string
	ok := false
	if tables, err := c.ListTables(); err != nil {
		parts = append(parts, "list: "+err.Error())
	} else {
		ok = true
		parts = append(parts, fmt.Sprintf("list: %d tables", len(tables)))
	}
	t := &nftables.Table{Name: fmt.Sprintf("netprobe_%d", os.Getpid()), Family: nftables.TableFamilyINet}
	c.AddTable(t)
	if err := c.Flush(); err != nil {
		parts = append(parts, "add: "+err.Error())
	} else {
		ok = true
		parts = append(parts, "add: table "+t.Name+" added")
		c.DelTable(t)
		if err := c.Flush(); err != nil {
			parts = append(parts, "delete: "+err.Error())
		}
	}
	detail := strings.Join(parts, "; ")
	if !ok {
		return "", errors.New(detail)
	}
	return detail, nil
}

// probeECH sends GET rawURL to the URL's address over TLS with an ECH
// extension hiding -sni (the URL's host when unset) behind the config's
// public name. The config list comes from -echconfig, or is made up here
// (public name: the URL's host), which no server can decrypt. ok when a
// TLS server answered the ClientHello: it accepted ECH, or it rejected it
// after a handshake on the outer name.
func probeECH(ctx context.Context, rawURL string, o options) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse URL: %w", err)
	}
	var list []byte
	if o.echConfig != "" {
		if list, err = os.ReadFile(o.echConfig); err != nil {
			return "", fmt.Errorf("read ECH config: %w", err)
		}
	} else if list, err = makeECHConfigList(u.Hostname()); err != nil {
		return "", err
	}
	cfg, err := tlsConfig(o, u.Hostname())
	if err != nil {
		return "", err
	}
	cfg.EncryptedClientHelloConfigList = list
	cfg.MinVersion = tls.VersionTLS13
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return "", fmt.Errorf("request: %w", err)
	}
	resp, err := (&http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}).RoundTrip(req)
	var rej *tls.ECHRejectionError
	var unverified *tls.CertificateVerificationError
	switch {
	case errors.As(err, &rej):
		return fmt.Sprintf("ECH rejected by a TLS server that answered (%d bytes of retry configs)", len(rej.RetryConfigList)), nil
	case errors.As(err, &unverified) && o.caFile == "":
		// On a rejection the client checks the outer name's certificate
		// even when told not to verify; the server answered all the same.
		return "ECH rejected by a TLS server that answered (its outer certificate unverified: " + unverified.Err.Error() + ")", nil
	case err != nil:
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return fmt.Sprintf("ECH accepted=%v, sni=%s; HTTP %d: %s", resp.TLS.ECHAccepted, resp.TLS.ServerName, resp.StatusCode, clip(body)), nil
}

// makeECHConfigList returns an ECHConfigList (draft-ietf-tls-esni,
// version 0xfe0d) for a fresh X25519 key nobody else holds.
func makeECHConfigList(publicName string) ([]byte, error) {
	if net.ParseIP(publicName) != nil || publicName == "" {
		publicName = "netprobe.invalid"
	}
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ECH key: %w", err)
	}
	pub := key.PublicKey().Bytes()
	u16 := func(b []byte, n int) []byte { return append(b, byte(n>>8), byte(n)) }
	var c []byte
	c = append(c, 1, 0x00, 0x20) // config id, DHKEM(X25519, HKDF-SHA256)
	c = u16(c, len(pub))
	c = append(c, pub...)
	c = u16(c, 4)
	c = append(c, 0x00, 0x01, 0x00, 0x01, 0) // HKDF-SHA256, AES-128-GCM; no maximum name length
	c = append(c, byte(len(publicName)))
	c = append(c, publicName...)
	c = u16(c, 0) // no extensions
	cfg := u16([]byte{0xfe, 0x0d}, len(c))
	cfg = append(cfg, c...)
	return append(u16(nil, len(cfg)), cfg...), nil
}
