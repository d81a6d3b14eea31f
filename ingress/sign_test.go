package ingress

import (
	"os"
	"strings"
	"testing"
	"time"
)

func testKeys(t *testing.T, ids ...byte) *Keys {
	t.Helper()
	var specs []string
	for _, id := range ids {
		s, err := GenerateKey(id)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, s)
	}
	k, err := ParseKeys(specs)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSignVerify(t *testing.T) {
	k := testKeys(t, 'a')
	id := "0b9f6a1e-3c1d-4a53-9d0e-6f2b8c7a9e10"
	now := time.Unix(1_800_000_000, 0)
	exp := now.Add(time.Hour)
	route, err := k.SignedRoute(id, 8080, exp, DNSLabelMax)
	if err != nil {
		t.Fatal(err)
	}
	if len(route) > DNSLabelMax {
		t.Fatalf("route %q is %d chars", route, len(route))
	}
	parts := strings.Split(route, "-")
	sig, expires := parts[len(parts)-1], parts[len(parts)-2]
	if len(sig) < MinSignatureChars+1 || sig[len(sig)-1] != 'a' {
		t.Fatalf("signature %q", sig)
	}
	if err := k.Verify(id, 8080, expires, sig, now); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		id      string
		port    int
		expires string
		sig     string
		now     time.Time
		want    error
	}{
		"expired":        {id, 8080, expires, sig, exp, ErrExpired},
		"other sandbox":  {id[:len(id)-1] + "1", 8080, expires, sig, now, ErrBadSignature},
		"other port":     {id, 8081, expires, sig, now, ErrBadSignature},
		"later expiry":   {id, 8080, FormatExpires(exp.Add(time.Second)), sig, now, ErrBadSignature},
		"leading zero":   {id, 8080, "0" + expires, sig, now, ErrBadSignature},
		"tampered":       {id, 8080, expires, flip(sig, 0), now, ErrBadSignature},
		"too short":      {id, 8080, expires, sig[:MinSignatureChars-1] + "a", now, ErrBadSignature},
		"unknown key id": {id, 8080, expires, sig[:len(sig)-1] + "b", now, ErrUnknownKey},
	} {
		if err := k.Verify(c.id, c.port, c.expires, c.sig, c.now); err != c.want {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	full, _ := k.SignedRoute(id, 8080, exp, 0)
	fs := full[strings.LastIndexByte(full, '-')+1:]
	if len(fs) != FullSignatureChars+1 || k.Verify(id, 8080, expires, fs, now) != nil {
		t.Errorf("full signature %q does not verify", fs)
	}
}

func flip(s string, i int) string {
	b := []byte(s)
	if b[i] == 'a' {
		b[i] = 'b'
	} else {
		b[i] = 'a'
	}
	return string(b)
}

func TestRotation(t *testing.T) {
	old := testKeys(t, 'a')
	now := time.Now()
	route, _ := old.SignedRoute("s1", 80, now.Add(time.Hour), 0)
	sig := route[strings.LastIndexByte(route, '-')+1:]
	exp := FormatExpires(now.Add(time.Hour))
	tok, _ := old.AccessToken("s1")

	fresh := testKeys(t, 'b')
	both, err := NewKeys(fresh.keys[0], old.keys[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := both.Verify("s1", 80, exp, sig, now); err != nil {
		t.Errorf("an old link stops working while its key is still listed: %v", err)
	}
	if !both.CheckAccessToken("s1", tok) {
		t.Error("an old access token stops working while its key is still listed")
	}
	newTok, _ := both.AccessToken("s1")
	if newTok[len(newTok)-1] != 'b' || newTok == tok {
		t.Errorf("the first key does not sign: %q", newTok)
	}
	if err := fresh.Verify("s1", 80, exp, sig, now); err != ErrUnknownKey {
		t.Errorf("a removed key's link: %v", err)
	}
	if fresh.CheckAccessToken("s1", tok) || both.CheckAccessToken("s2", tok) || both.CheckAccessToken("s1", "") {
		t.Error("an access token works for a removed key, another sandbox or empty")
	}
}

func TestParseKeyErrors(t *testing.T) {
	for _, s := range []string{"", "a", "ab:AAAA", "A:" + strings.Repeat("A", 44), "a:short", "a:!!!"} {
		if _, err := ParseKey(s); err == nil {
			t.Errorf("ParseKey(%q) accepted", s)
		}
	}
	a, _ := GenerateKey('a')
	if _, err := ParseKeys([]string{a, a}); err == nil {
		t.Error("a duplicate key id is accepted")
	}
}

func TestReadKeysFileEmpty(t *testing.T) {
	path := t.TempDir() + "/keys"
	for _, content := range []string{"", "# only a comment\n\n"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if k, err := ReadKeysFile(path); err == nil {
			t.Errorf("a key file holding %q gave keys %q, want an error", content, k.IDs())
		}
	}
}
