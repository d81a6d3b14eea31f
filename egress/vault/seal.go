package vault

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
)

// KeySize is the size of a sealing key: AES-256.
const KeySize = 32

// sealMagic and sealVersion open every sealed blob: "osbs", then the
// format version. The header is authenticated with the data.
const (
	sealMagic   = "osbs"
	sealVersion = 1
	headerSize  = len(sealMagic) + 1
)

// vaultContext is prefixed to the caller's context when a vault is
// sealed, so that a vault and another blob sealed with the same key and
// context cannot be taken for one another.
const vaultContext = "opensandbox credential vault\x00"

// ErrUnseal is returned when sealed data cannot be opened: the key or
// the context is not the one it was sealed with, or the data was
// changed.
var ErrUnseal = errors.New("sealed data: wrong key or context, or the data was changed")

// SealBytes encrypts and authenticates plaintext with key (KeySize
// bytes) by AES-256-GCM under a random nonce. aad is context that is
// authenticated but not stored: OpenBytes needs the same. The result is a
// versioned header, the nonce, and the ciphertext with its tag.
func SealBytes(key, plaintext []byte, aad string) ([]byte, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, headerSize+aead.NonceSize(), headerSize+aead.NonceSize()+len(plaintext)+aead.Overhead())
	copy(out, sealMagic)
	out[len(sealMagic)] = sealVersion
	nonce := out[headerSize:]
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal: nonce: %w", err)
	}
	return aead.Seal(out, nonce, plaintext, additional(out[:headerSize], aad)), nil
}

// OpenBytes decrypts what SealBytes made with the same key and aad. It
// fails with ErrUnseal when the key, the aad or the data is not the one
// sealed.
func OpenBytes(key, data []byte, aad string) ([]byte, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	if len(data) < headerSize || string(data[:len(sealMagic)]) != sealMagic {
		return nil, errors.New("open sealed data: not sealed data (bad header)")
	}
	if v := data[len(sealMagic)]; v != sealVersion {
		return nil, fmt.Errorf("open sealed data: format version %d, want %d", v, sealVersion)
	}
	if len(data) < headerSize+aead.NonceSize()+aead.Overhead() {
		return nil, fmt.Errorf("open sealed data: %d bytes, too short", len(data))
	}
	nonce := data[headerSize : headerSize+aead.NonceSize()]
	plain, err := aead.Open(nil, nonce, data[headerSize+aead.NonceSize():], additional(data[:headerSize], aad))
	if err != nil {
		return nil, ErrUnseal
	}
	return plain, nil
}

// newAEAD returns AES-256-GCM with key.
func newAEAD(key []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("sealing key: %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("sealing key: %w", err)
	}
	return cipher.NewGCM(block)
}

// additional is the authenticated data: the header, then the caller's
// context.
func additional(header []byte, aad string) []byte {
	return append(bytes.Clone(header), aad...)
}

// sealedVault is the plaintext of a sealed vault: all of it, values
// included.
type sealedVault struct {
	Revision    int64                   `json:"revision"`
	Credentials []sealedCredential      `json:"credentials"`
	Bindings    []api.CredentialBinding `json:"bindings"`
}

type sealedCredential struct {
	Name       string `json:"name"`
	SourceType string `json:"sourceType"`
	Value      string `json:"value"`
	Revision   int64  `json:"revision"`
}

// Seal encrypts the whole vault, values included, with key (KeySize
// bytes); aad is context (the sandbox's identity, say) that Open must be
// given again. A vault sealed with a context cannot be opened by
// OpenBytes with the same context, nor another blob by Open.
func Seal(key []byte, v *Vault, aad string) ([]byte, error) {
	if v == nil {
		return nil, errors.New("seal credential vault: no vault")
	}
	sv := sealedVault{Revision: v.revision, Credentials: make([]sealedCredential, 0, len(v.creds)), Bindings: make([]api.CredentialBinding, len(v.bindings))}
	for _, m := range v.Credentials() {
		c := v.creds[m.Name]
		sv.Credentials = append(sv.Credentials, sealedCredential{Name: m.Name, SourceType: c.sourceType, Value: c.value, Revision: c.revision})
	}
	for i, b := range v.bindings {
		sv.Bindings[i] = b.spec
	}
	plain, err := json.Marshal(sv)
	if err != nil {
		return nil, fmt.Errorf("seal credential vault: encode: %w", err)
	}
	defer clear(plain)
	out, err := SealBytes(key, plain, vaultContext+aad)
	if err != nil {
		return nil, fmt.Errorf("seal credential vault: %w", err)
	}
	return out, nil
}

// Open decrypts a vault Seal made with the same key and aad, and checks
// it as Create would, except that binding hosts are not checked against
// a policy and "http" bindings are kept: they were checked when they were
// made, and the caller may check them again (CheckHosts).
func Open(key, data []byte, aad string) (*Vault, error) {
	plain, err := OpenBytes(key, data, vaultContext+aad)
	if err != nil {
		return nil, fmt.Errorf("open credential vault: %w", err)
	}
	defer clear(plain)
	var sv sealedVault
	if err := json.Unmarshal(plain, &sv); err != nil {
		return nil, fmt.Errorf("open credential vault: decode: %s", jsonError(err))
	}
	if sv.Revision < 1 {
		return nil, fmt.Errorf("open credential vault: revision %d", sv.Revision)
	}
	creds := make(map[string]credential, len(sv.Credentials))
	for i, c := range sv.Credentials {
		nc, err := newCredential(fmt.Sprintf("credentials[%d]", i), api.Credential{Name: c.Name, Source: api.CredentialSource{Type: c.SourceType, Value: c.Value}}, c.Revision)
		if err != nil {
			return nil, fmt.Errorf("open credential vault: %w", err)
		}
		if c.Revision < 1 || c.Revision > sv.Revision {
			return nil, fmt.Errorf("open credential vault: credential %q: revision %d, the vault's is %d", c.Name, c.Revision, sv.Revision)
		}
		if _, dup := creds[c.Name]; dup {
			return nil, fmt.Errorf("open credential vault: credential %q appears twice", c.Name)
		}
		creds[c.Name] = nc
	}
	specs := make(map[string]api.CredentialBinding, len(sv.Bindings))
	for i, b := range sv.Bindings {
		nb, err := normaliseBinding(fmt.Sprintf("bindings[%d]", i), b, Options{AllowHTTP: true})
		if err != nil {
			return nil, fmt.Errorf("open credential vault: %w", err)
		}
		if _, dup := specs[nb.Name]; dup {
			return nil, fmt.Errorf("open credential vault: binding %q appears twice", nb.Name)
		}
		specs[nb.Name] = nb
	}
	v, err := build(sv.Revision, creds, specs)
	if err != nil {
		return nil, fmt.Errorf("open credential vault: %w", err)
	}
	return v, nil
}

// FileStore keeps the vault in force sealed in one file, so that it
// survives a restart of osb-egress. Save replaces the file atomically,
// as egress.FileStore does; the file holds only sealed data.
type FileStore struct {
	// Path is the file's path; its directory must exist.
	Path string
	// Key is the sealing key, KeySize bytes.
	Key []byte
	// AAD is the context the vault is sealed under (see Seal).
	AAD string
}

// Load returns the stored vault; ok is false when there is no file.
func (s *FileStore) Load() (v *Vault, ok bool, err error) {
	data, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	} else if err != nil {
		return nil, false, fmt.Errorf("read credential vault file: %w", err)
	}
	v, err = Open(s.Key, data, s.AAD)
	if err != nil {
		return nil, false, fmt.Errorf("credential vault file %s: %w", s.Path, err)
	}
	return v, true, nil
}

// Save seals v into the file; nil removes the file.
func (s *FileStore) Save(v *Vault) error {
	if v == nil {
		if err := os.Remove(s.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove credential vault file: %w", err)
		}
		return egress.SyncDir(filepath.Dir(s.Path))
	}
	data, err := Seal(s.Key, v, s.AAD)
	if err != nil {
		return err
	}
	if err := egress.WriteFileAtomic(s.Path, data); err != nil {
		return fmt.Errorf("save credential vault: %w", err)
	}
	return nil
}
