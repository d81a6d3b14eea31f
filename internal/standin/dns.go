package standin

import (
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
)

// answer builds the reply to the DNS query msg from records, and notes
// the question in d.
func answer(msg []byte, records map[string]netip.Addr, from string, d *DNS) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil, err
	}
	if h.Response {
		return nil, errNotAQuery
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	name := strings.ToLower(q.Name.String())
	d.record(name + " " + strings.TrimPrefix(q.Type.String(), "Type") + " from " + from)
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	addr, known := records[name]
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	rr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}
	switch {
	case known && q.Type == dnsmessage.TypeA && addr.Is4():
		if err := b.AResource(rr, dnsmessage.AResource{A: addr.As4()}); err != nil {
			return nil, err
		}
	case known && q.Type == dnsmessage.TypeAAAA && addr.Is6():
		if err := b.AAAAResource(rr, dnsmessage.AAAAResource{AAAA: addr.As16()}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}
