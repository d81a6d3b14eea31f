package proxy

import "errors"

// The outcomes of parsing the first bytes of a connection other than a
// complete message.
var (
	// errIncomplete means the bytes so far are a prefix of a message that
	// more bytes may complete.
	errIncomplete = errors.New("incomplete")
	// errNotTLS means the bytes cannot start a TLS handshake.
	errNotTLS = errors.New("not a TLS handshake")
	// errNotHTTP means the bytes cannot start an HTTP/1.x request.
	errNotHTTP = errors.New("not an HTTP/1.x request")
	// errMalformed means the bytes start a TLS ClientHello or an HTTP
	// request but break its grammar, or say something ambiguous.
	errMalformed = errors.New("malformed")
)

// TLS constants from RFC 8446, RFC 6066 and the ECH draft.
const (
	recordTypeHandshake      = 0x16
	handshakeTypeClientHello = 1
	maxRecordLen             = 1 << 14
	extServerName            = 0x0000
	extECH                   = 0xfe0d // encrypted_client_hello
	extESNI                  = 0xffce // the ECH draft's predecessor, encrypted_server_name
	serverNameTypeHostName   = 0

	// maxHelloLen bounds the ClientHello the proxy reassembles. Real ones
	// are under 2 KiB (a few more with post-quantum key shares).
	maxHelloLen = 64 << 10
)

// clientHello is what the proxy needs from a TLS ClientHello.
type clientHello struct {
	// serverName is the host_name of the server_name extension, as sent.
	serverName string
	// hasServerName is false when the extension is absent.
	hasServerName bool
	// encrypted is true when the hello carries an Encrypted Client Hello
	// (or ESNI) extension: its visible name need not be the real one.
	encrypted bool
}

// parseClientHello parses the first bytes a client sent as TLS records
// holding a ClientHello, reassembling one that spans several records. It
// returns errIncomplete while b is a prefix of one, errNotTLS when b
// cannot start a TLS handshake, and errMalformed when it breaks the
// grammar: duplicate extensions, two host names, trailing bytes.
func parseClientHello(b []byte) (clientHello, error) {
	if len(b) >= 1 && b[0] != recordTypeHandshake {
		return clientHello{}, errNotTLS
	}
	if len(b) >= 2 && b[1] != 3 {
		return clientHello{}, errNotTLS
	}
	if len(b) >= 3 && b[2] > 4 {
		return clientHello{}, errNotTLS
	}
	// Collect handshake bytes from successive records. The common case is
	// one record, which is used in place.
	var hs []byte
	single := true
	for {
		if len(b) < 5 {
			return clientHello{}, errIncomplete
		}
		if b[0] != recordTypeHandshake || b[1] != 3 {
			return clientHello{}, errMalformed
		}
		n := int(b[3])<<8 | int(b[4])
		if n == 0 || n > maxRecordLen {
			return clientHello{}, errMalformed
		}
		if len(b) < 5+n {
			return clientHello{}, errIncomplete
		}
		frag := b[5 : 5+n]
		b = b[5+n:]
		if hs == nil {
			hs = frag
		} else {
			if single {
				hs = append([]byte(nil), hs...)
				single = false
			}
			hs = append(hs, frag...)
		}
		if len(hs) < 4 {
			if len(b) == 0 {
				return clientHello{}, errIncomplete
			}
			continue
		}
		if hs[0] != handshakeTypeClientHello {
			return clientHello{}, errMalformed
		}
		msgLen := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
		if msgLen > maxHelloLen {
			return clientHello{}, errMalformed
		}
		if len(hs) >= 4+msgLen {
			hello, err := parseClientHelloBody(hs[4 : 4+msgLen])
			if err != nil {
				return clientHello{}, err
			}
			return hello, nil
		}
		if len(b) == 0 {
			return clientHello{}, errIncomplete
		}
	}
}

// parseClientHelloBody parses a ClientHello handshake message's body.
func parseClientHelloBody(body []byte) (clientHello, error) {
	r := reader(body)
	var hello clientHello
	if _, ok := r.bytes(2 + 32); !ok { // legacy_version, random
		return hello, errMalformed
	}
	if sid, ok := r.vec8(); !ok || len(sid) > 32 {
		return hello, errMalformed
	}
	if suites, ok := r.vec16(); !ok || len(suites) < 2 || len(suites)%2 != 0 {
		return hello, errMalformed
	}
	if comp, ok := r.vec8(); !ok || len(comp) < 1 {
		return hello, errMalformed
	}
	if len(r) == 0 {
		return hello, nil // no extensions at all: no server name
	}
	exts, ok := r.vec16()
	if !ok || len(r) != 0 {
		return hello, errMalformed
	}
	var seen [1 << 16 / 64]uint64
	for len(exts) > 0 {
		typ, ok := exts.u16()
		if !ok {
			return hello, errMalformed
		}
		data, ok := exts.vec16()
		if !ok {
			return hello, errMalformed
		}
		if seen[typ/64]&(1<<(typ%64)) != 0 {
			return hello, errMalformed // RFC 8446 4.2: at most one of each type
		}
		seen[typ/64] |= 1 << (typ % 64)
		switch typ {
		case extServerName:
			name, err := parseServerName(data)
			if err != nil {
				return hello, err
			}
			hello.serverName, hello.hasServerName = name, true
		case extECH, extESNI:
			hello.encrypted = true
		}
	}
	return hello, nil
}

// parseServerName returns the host_name of a server_name extension's
// data (RFC 6066 section 3).
func parseServerName(data reader) (string, error) {
	list, ok := data.vec16()
	if !ok || len(data) != 0 || len(list) == 0 {
		return "", errMalformed
	}
	var name []byte
	for len(list) > 0 {
		typ, ok := list.u8()
		if !ok {
			return "", errMalformed
		}
		v, ok := list.vec16()
		if !ok || len(v) == 0 {
			return "", errMalformed
		}
		if typ != serverNameTypeHostName {
			continue
		}
		if name != nil {
			return "", errMalformed // two host names: which one counts?
		}
		name = v
	}
	if name == nil {
		return "", errMalformed
	}
	return string(name), nil
}

// reader consumes big-endian integers and length-prefixed vectors from
// the front of a byte slice.
type reader []byte

func (r *reader) bytes(n int) ([]byte, bool) {
	if n < 0 || len(*r) < n {
		return nil, false
	}
	v := (*r)[:n]
	*r = (*r)[n:]
	return v, true
}

func (r *reader) u8() (uint8, bool) {
	v, ok := r.bytes(1)
	if !ok {
		return 0, false
	}
	return v[0], true
}

func (r *reader) u16() (uint16, bool) {
	v, ok := r.bytes(2)
	if !ok {
		return 0, false
	}
	return uint16(v[0])<<8 | uint16(v[1]), true
}

func (r *reader) vec8() (reader, bool) {
	n, ok := r.u8()
	if !ok {
		return nil, false
	}
	v, ok := r.bytes(int(n))
	return reader(v), ok
}

func (r *reader) vec16() (reader, bool) {
	n, ok := r.u16()
	if !ok {
		return nil, false
	}
	v, ok := r.bytes(int(n))
	return reader(v), ok
}
