// Command netprobe makes one outbound attempt from inside a sandbox and
// prints one JSON line, {"ok":bool,"detail":string}: ok when the attempt
// got through (a server answered), detail saying what came back or what
// stopped it. Egress tests upload it (built static, CGO_ENABLED=0, by
// standin.Netprobe) and run it where the policy applies.
//
//	netprobe tcp HOST:PORT                 connect, send a line, read a reply
//	netprobe ipv6 [ADDR]:PORT              the same over IPv6 only
//	netprobe udp HOST:PORT                 send a datagram, wait for one back
//	netprobe http URL [-host H]            GET; ok on a 2xx status
//	netprobe https URL [-sni S] [-nosni] [-cafile F] [-host H]
//	                                       GET over TLS with a chosen SNI to the URL's address
//	netprobe dns NAME [-server ADDR:PORT] [-tcp] [-type A|AAAA|HTTPS|CNAME]
//	                                       ok on NOERROR with an answer of that type
//	netprobe dot ADDR:PORT NAME [-sni S] [-cafile F]
//	netprobe doh URL NAME [-sni S] [-cafile F]
//	netprobe raw                           open a raw IPv4 and a packet socket; ok if either opens
//	netprobe nft                           list and add an nftables table; ok if either works
//	netprobe ech URL [-sni S] [-echconfig F] [-cafile F]
//	                                       TLS with an ECH extension hiding S; ok when a TLS server answered
//	netprobe fetch URL [-method M] [-data D] [-header "K: V"]... [-host H] [-sni S] [-cafile F] [-h2]
//	                                       one request, verified against the system roots unless -cafile;
//	                                       ok on any status; detail is the response as JSON
//	netprobe ws wss://... [-header "K: V"]... [-host H] [-sni S] [-cafile F]
//	                                       a WebSocket upgrade, one message sent, the first one back
//
//	netprobe bench http|dns|download|hold TARGET [-n N] [-for D]
//	                                       measure instead of attempting once (see bench.go)
//
// Every command takes -timeout (default 3s; a minute for bench) bounding
// the whole attempt.
// Without -cafile, certificates are not verified. The exit status is 0
// when ok, 1 when not, 2 on a usage error.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// result is the one line netprobe prints.
type result struct {
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "bench" {
		r, usage := runBench(context.Background(), os.Args[2:])
		json.NewEncoder(os.Stdout).Encode(r)
		switch {
		case usage:
			os.Exit(2)
		case !r.OK:
			os.Exit(1)
		}
		return
	}
	r, usage := run(context.Background(), os.Args[1:])
	json.NewEncoder(os.Stdout).Encode(r)
	switch {
	case usage:
		os.Exit(2)
	case !r.OK:
		os.Exit(1)
	}
}

// options are the flags of every command; each command reads the ones it
// names.
type options struct {
	timeout   time.Duration
	host      string
	sni       string
	noSNI     bool
	caFile    string
	server    string
	tcp       bool
	qtype     string
	echConfig string
	method    string
	data      string
	headers   headerList
	h2        bool
}

// headerList collects repeated -header flags.
type headerList []string

func (h *headerList) String() string     { return strings.Join(*h, ", ") }
func (h *headerList) Set(v string) error { *h = append(*h, v); return nil }

// parse reads args, flags anywhere among them, into positional
// arguments and options.
func parse(args []string) ([]string, options, error) {
	var o options
	fs := flag.NewFlagSet("netprobe", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.DurationVar(&o.timeout, "timeout", 3*time.Second, "bound of the whole attempt")
	fs.StringVar(&o.host, "host", "", "HTTP Host header")
	fs.StringVar(&o.sni, "sni", "", "TLS server name")
	fs.BoolVar(&o.noSNI, "nosni", false, "send no TLS server name")
	fs.StringVar(&o.caFile, "cafile", "", "PEM file of the CA to verify against")
	fs.StringVar(&o.server, "server", "", "DNS server ADDR:PORT")
	fs.BoolVar(&o.tcp, "tcp", false, "DNS over TCP")
	fs.StringVar(&o.qtype, "type", "A", "DNS query type")
	fs.StringVar(&o.echConfig, "echconfig", "", "file holding an ECHConfigList")
	fs.StringVar(&o.method, "method", "GET", "HTTP method of fetch")
	fs.StringVar(&o.data, "data", "", "request body of fetch")
	fs.Var(&o.headers, "header", "a request header \"Name: value\" (repeatable)")
	fs.BoolVar(&o.h2, "h2", false, "offer HTTP/2 (fetch)")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, o, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, o, nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}

// run makes the attempt args ask for. usage reports that args were not
// understood.
func run(ctx context.Context, args []string) (r result, usage bool) {
	pos, o, err := parse(args)
	if err != nil || len(pos) == 0 {
		return result{Detail: fmt.Sprintf("usage: netprobe COMMAND ARGS... (%v)", err)}, true
	}
	cmd, pos := pos[0], pos[1:]
	want := map[string]int{"tcp": 1, "ipv6": 1, "udp": 1, "http": 1, "https": 1, "dns": 1, "dot": 2, "doh": 2, "raw": 0, "nft": 0, "ech": 1, "fetch": 1, "ws": 1}
	n, known := want[cmd]
	if !known || len(pos) != n {
		return result{Detail: fmt.Sprintf("usage: netprobe %s takes %d argument(s), got %q", cmd, n, pos)}, true
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var detail string
	switch cmd {
	case "tcp":
		detail, err = probeTCP(ctx, "tcp", pos[0])
	case "ipv6":
		detail, err = probeTCP(ctx, "tcp6", pos[0])
	case "udp":
		detail, err = probeUDP(ctx, pos[0])
	case "http", "https":
		detail, err = probeHTTP(ctx, pos[0], o)
	case "dns":
		detail, err = probeDNS(ctx, pos[0], o)
	case "dot":
		detail, err = probeDoT(ctx, pos[0], pos[1], o)
	case "doh":
		detail, err = probeDoH(ctx, pos[0], pos[1], o)
	case "raw":
		detail, err = probeRaw()
	case "nft":
		detail, err = probeNft()
	case "ech":
		detail, err = probeECH(ctx, pos[0], o)
	case "fetch":
		detail, err = probeFetch(ctx, pos[0], o)
	case "ws":
		detail, err = probeWS(ctx, pos[0], o)
	}
	if err != nil {
		if detail != "" {
			return result{Detail: detail + ": " + err.Error()}, false
		}
		return result{Detail: err.Error()}, false
	}
	return result{OK: true, Detail: detail}, false
}

// clip shortens what a server sent to a readable detail.
func clip(b []byte) string {
	s := string(b)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return strings.TrimRight(s, "\r\n")
}
