// Package ingress is the gateway in front of every sandbox's ports: it
// routes a request by header, path or subdomain to a sandbox's port,
// checks that the caller may reach it, and streams the exchange.
package ingress

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// A signature is the lowercase base32 of HMAC-SHA256(secret, canonical),
// cut to at least MinSignatureChars, followed by the one-character id of
// the key that made it. Verification accepts any length from the minimum
// to the whole digest, so an issuer can make a route fit a DNS label.
const (
	// MinSignatureChars is the shortest signature accepted, key id
	// excluded: 12 base32 characters, 60 bits.
	MinSignatureChars = 12
	// FullSignatureChars is the whole digest in base32.
	FullSignatureChars = 52
	// maxLabel is the length of a DNS label.
	maxLabel = 63
	// minSecret is the shortest signing secret accepted, in bytes.
	minSecret = 32
)

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Key is one signing key: a one-character id ([0-9a-z]) carried at the
// end of each signature it makes, and its secret.
type Key struct {
	ID     byte
	Secret []byte
}

// Keys is a gateway's or server's set of signing keys. The first signs;
// all verify, so a key is rotated by putting a new one first and
// removing the old one once the links it signed may expire.
type Keys struct {
	keys []Key
}

// ParseKey reads "ID:BASE64" (standard or URL base64, padded or not);
// the secret must be at least 32 bytes.
func ParseKey(s string) (Key, error) {
	id, secret, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok || len(id) != 1 || !isKeyID(id[0]) {
		return Key{}, errors.New(`a signing key is "ID:BASE64SECRET" with a one-character id of 0-9 or a-z`)
	}
	var raw []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if raw, err = enc.DecodeString(secret); err == nil {
			break
		}
	}
	if err != nil {
		return Key{}, fmt.Errorf("signing key %s: the secret is not base64", id)
	}
	if len(raw) < minSecret {
		return Key{}, fmt.Errorf("signing key %s: the secret has %d bytes, at least %d are needed", id, len(raw), minSecret)
	}
	return Key{ID: id[0], Secret: raw}, nil
}

// NewKeys makes a key set; ids must be distinct. The first key signs.
func NewKeys(keys ...Key) (*Keys, error) {
	seen := map[byte]bool{}
	for _, k := range keys {
		if !isKeyID(k.ID) {
			return nil, fmt.Errorf("signing key id %q: use one of 0-9 or a-z", k.ID)
		}
		if len(k.Secret) < minSecret {
			return nil, fmt.Errorf("signing key %c: the secret has %d bytes, at least %d are needed", k.ID, len(k.Secret), minSecret)
		}
		if seen[k.ID] {
			return nil, fmt.Errorf("signing key id %c is used twice", k.ID)
		}
		seen[k.ID] = true
	}
	return &Keys{keys: keys}, nil
}

// ParseKeys parses each "ID:BASE64" string; see NewKeys.
func ParseKeys(specs []string) (*Keys, error) {
	var keys []Key
	for _, s := range specs {
		k, err := ParseKey(s)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return NewKeys(keys...)
}

// ReadKeysFile reads a key file: one "ID:BASE64" per line, the signing
// key first; blank lines and lines starting with # are skipped.
func ReadKeysFile(path string) (*Keys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var specs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		specs = append(specs, line)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(specs) == 0 {
		// Empty, or read while being rewritten in place: never taken for
		// "no keys", which would refuse every token and link.
		return nil, fmt.Errorf("%s: no signing key in the file", path)
	}
	k, err := ParseKeys(specs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// GenerateKey returns a new key with id in "ID:BASE64" form.
func GenerateKey(id byte) (string, error) {
	if !isKeyID(id) {
		return "", fmt.Errorf("signing key id %q: use one of 0-9 or a-z", id)
	}
	secret := make([]byte, minSecret)
	if _, err := io.ReadFull(rand.Reader, secret); err != nil {
		return "", err
	}
	return string(id) + ":" + base64.StdEncoding.EncodeToString(secret), nil
}

// Empty reports whether the set has no key: nothing can be signed or
// verified.
func (k *Keys) Empty() bool { return k == nil || len(k.keys) == 0 }

// IDs returns the key ids, the signing key first.
func (k *Keys) IDs() string {
	var b strings.Builder
	if k != nil {
		for _, key := range k.keys {
			b.WriteByte(key.ID)
		}
	}
	return b.String()
}

func isKeyID(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' }

func (k *Keys) find(id byte) *Key {
	for i := range k.keys {
		if k.keys[i].ID == id {
			return &k.keys[i]
		}
	}
	return nil
}

func mac(secret []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, secret)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{'\n'})
	}
	return m.Sum(nil)
}

// FormatExpires is the route's spelling of an expiry: lowercase base36
// of its Unix seconds.
func FormatExpires(t time.Time) string { return strconv.FormatInt(t.Unix(), 36) }

func signatureFor(key *Key, sandboxID string, port int, expires string) string {
	return b32.EncodeToString(mac(key.Secret, "osb-ingress-route-v1", sandboxID, strconv.Itoa(port), expires))
}

// Sign returns the signature of a route to port of sandboxID valid until
// expires, with the signing key: sigChars characters of digest (clamped
// to MinSignatureChars..FullSignatureChars) and the key id.
func (k *Keys) Sign(sandboxID string, port int, expires time.Time, sigChars int) (string, error) {
	if k.Empty() {
		return "", errors.New("no signing key is configured")
	}
	sigChars = min(max(sigChars, MinSignatureChars), FullSignatureChars)
	key := &k.keys[0]
	return signatureFor(key, sandboxID, port, FormatExpires(expires))[:sigChars] + string(key.ID), nil
}

// SignedRoute returns "{sandboxId}-{port}-{expires}-{signature}" with
// the longest signature that keeps it within labelMax characters (a DNS
// label is 63), or the full signature when labelMax is 0. The route
// is refused when even the shortest signature does not fit.
func (k *Keys) SignedRoute(sandboxID string, port int, expires time.Time, labelMax int) (string, error) {
	prefix := sandboxID + "-" + strconv.Itoa(port) + "-" + FormatExpires(expires) + "-"
	chars := FullSignatureChars
	if labelMax > 0 {
		chars = labelMax - len(prefix) - 1
		if chars < MinSignatureChars {
			return "", fmt.Errorf("a signed route for sandbox %s does not fit in a %d-character DNS label", sandboxID, labelMax)
		}
	}
	sig, err := k.Sign(sandboxID, port, expires, chars)
	if err != nil {
		return "", err
	}
	return prefix + sig, nil
}

// DNSLabelMax is the labelMax of SignedRoute for subdomain routes.
const DNSLabelMax = maxLabel

// Signature errors. Callers answer each with 401 without saying which.
var (
	ErrBadSignature = errors.New("the route's signature does not verify")
	ErrExpired      = errors.New("the signed route has expired")
	ErrUnknownKey   = errors.New("the route was signed with a key this gateway does not have")
	ErrNoKeys       = errors.New("the gateway has no signing keys to verify routes with")
)

// Verify checks a signed route's signature and expiry (expires in its
// base36 spelling) at now.
func (k *Keys) Verify(sandboxID string, port int, expires, signature string, now time.Time) error {
	if k.Empty() {
		return ErrNoKeys
	}
	if len(signature) < MinSignatureChars+1 || len(signature) > FullSignatureChars+1 {
		return ErrBadSignature
	}
	key := k.find(signature[len(signature)-1])
	if key == nil {
		return ErrUnknownKey
	}
	secs, err := strconv.ParseInt(expires, 36, 64)
	if err != nil || expires != strconv.FormatInt(secs, 36) {
		return ErrBadSignature
	}
	want := signatureFor(key, sandboxID, port, expires)
	got := signature[:len(signature)-1]
	if subtle.ConstantTimeCompare([]byte(got), []byte(want[:len(got)])) != 1 {
		return ErrBadSignature
	}
	if !now.Before(time.Unix(secs, 0)) {
		return ErrExpired
	}
	return nil
}

// AccessToken is the token of sandboxID that the gateway accepts in
// OpenSandbox-Secure-Access, made with the signing key. Every sandbox
// has one; the gateway recomputes it, so nothing stores it.
func (k *Keys) AccessToken(sandboxID string) (string, error) {
	if k.Empty() {
		return "", errors.New("no signing key is configured")
	}
	return accessToken(&k.keys[0], sandboxID), nil
}

func accessToken(key *Key, sandboxID string) string {
	return base64.RawURLEncoding.EncodeToString(mac(key.Secret, "osb-ingress-access-v1", sandboxID)) + string(key.ID)
}

// CheckAccessToken reports whether token is sandboxID's access token
// under one of the keys (constant time in the token's content).
func (k *Keys) CheckAccessToken(sandboxID, token string) bool {
	if k.Empty() || token == "" {
		return false
	}
	key := k.find(token[len(token)-1])
	if key == nil {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(token), []byte(accessToken(key, sandboxID))) == 1
}
