package sandbox

import "testing"

func TestParseDestination(t *testing.T) {
	good := []struct {
		in, want string
		port     uint16
	}{
		{"10.1.2.3", "10.1.2.3/32", 0},
		{"10.0.0.0/8", "10.0.0.0/8", 0},
		{"10.1.2.3:443", "10.1.2.3/32", 443},
		{"10.1.0.0/16:5432", "10.1.0.0/16", 5432},
		{"fd00::1", "fd00::1/128", 0},
		{"fc00::/7", "fc00::/7", 0},
		{"[fd00::1]:443", "fd00::1/128", 443},
		{"[fd00::/64]:53", "fd00::/64", 53},
		{"[fd00::/64]", "fd00::/64", 0},
	}
	for _, c := range good {
		d, err := ParseDestination(c.in, true)
		if err != nil || d.Prefix.String() != c.want || d.Port != c.port {
			t.Errorf("ParseDestination(%q) = %v port %d, %v; want %s port %d", c.in, d.Prefix, d.Port, err, c.want, c.port)
		}
	}
	bad := []struct{ in, why string }{
		{"", "empty"},
		{"10.1.2.3/8", "the range starts at 10.0.0.0"},
		{"10.1.2", "not an address"},
		{"10.0.0.0/33", "no such length"},
		{"10.1.2.3:0", "port 0"},
		{"10.1.2.3:65536", "port too big"},
		{"10.1.2.3:http", "port by name"},
		{"[10.1.2.3]:80", "brackets around IPv4"},
		{"[fd00::1", "no ]"},
		{"[fd00::1]443", "no : before the port"},
		{"fe80::1%eth0", "a zone"},
		{"::ffff:169.254.169.254", "IPv4-mapped"},
		{"::ffff:10.0.0.0/104", "IPv4-mapped range"},
		{"metadata.google.internal", "a name"},
	}
	for _, c := range bad {
		if d, err := ParseDestination(c.in, true); err == nil {
			t.Errorf("ParseDestination(%q) = %v, want an error (%s)", c.in, d, c.why)
		}
	}
	if _, err := ParseDestination("10.1.2.3:443", false); err == nil {
		t.Error("a port where none is allowed was accepted")
	}
}

func FuzzParseDestination(f *testing.F) {
	for _, s := range []string{"10.1.2.3", "10.0.0.0/8:443", "[fd00::/64]:53", "fe80::1%eth0", "[", "1.2.3.4:", "::ffff:1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDestination(s, true)
		if err != nil {
			return
		}
		if !d.Prefix.IsValid() || d.Prefix != d.Prefix.Masked() || d.Prefix.Addr().Zone() != "" {
			t.Fatalf("ParseDestination(%q) = %v: not a clean range", s, d.Prefix)
		}
		again, err := ParseDestination(d.String(), true)
		if err != nil || again != d {
			t.Fatalf("ParseDestination(%q) = %v, whose String %q reads back as %v, %v", s, d, d.String(), again, err)
		}
	})
}
