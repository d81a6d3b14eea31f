package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// vaultCommand is `osb credential-vault`, alias `osb vault`.
func (a *app) vaultCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "credential-vault",
		Aliases: []string{"vault"},
		Short:   "Give a sandbox credentials it uses without seeing them",
		Long: `Manage the credential vault of a sandbox: named secrets, and bindings that say
which outbound HTTPS requests of the sandbox get which secret, as a header
(bearer, basic, apiKey or custom headers). The sandbox's credential proxy puts
the secret into each matching request on its way out, so the secret never
enters the sandbox.

Only a sandbox created with --credential-proxy (and so with
--network-policy-file) has a vault, and every host of a binding must be
allowed by an explicit allow rule of its egress policy.

Secrets are write-only: no command prints one, and the egress API never
returns one. Give them with --credential NAME=env:VAR (read from the
environment) or NAME=file:PATH (read from a file), so that they never sit in
a JSON file or in your shell's history.`,
		Example: `  export GITHUB_TOKEN=...
  osb credential-vault create sb-123 -f bindings.json --credential gh-token=env:GITHUB_TOKEN
  osb vault get sb-123
  osb vault patch sb-123 --replace-credential gh-token=file:./new-token.txt`,
	}
	cmd.AddCommand(a.vaultCreate(), a.vaultGet(), a.vaultPatch(), a.vaultDelete(), a.vaultCredentials(), a.vaultBindings())
	return cmd
}

// vaultError makes the vault's errors say what to do about them.
func vaultError(err error) error {
	switch {
	case errors.Is(err, sdk.ErrNoEgress):
		return fmt.Errorf("%w; create the sandbox with --network-policy-file and --credential-proxy to give it a vault", err)
	case errors.Is(err, sdk.ErrNoCredentialProxy):
		return fmt.Errorf("%w; create the sandbox with --credential-proxy, or wait a moment if it has just started", err)
	case errors.Is(err, sdk.ErrNoVault):
		return fmt.Errorf("%w; create one with osb credential-vault create", err)
	case errors.Is(err, sdk.ErrVaultExists):
		return fmt.Errorf("%w; change it with osb credential-vault patch, or delete it first", err)
	case errors.Is(err, sdk.ErrRevisionConflict):
		return fmt.Errorf("%w; read it again with osb credential-vault get", err)
	case errors.Is(err, sdk.ErrVaultNeedsTLS):
		return fmt.Errorf("%w; reach the sandbox over https (--protocol https)", err)
	}
	return err
}

// credentialFlag is one --credential NAME=env:VAR or NAME=file:PATH.
type credentialFlag struct {
	name, kind, ref string
}

// parseCredentialFlag reads NAME=env:VAR or NAME=file:PATH. A literal
// value is refused: it would sit in the shell's history.
func parseCredentialFlag(cmd *cobra.Command, flag, s string) (credentialFlag, error) {
	name, src, ok := strings.Cut(s, "=")
	name = strings.TrimSpace(name)
	kind, ref, _ := strings.Cut(src, ":")
	switch {
	case !ok || name == "":
		// s may be the secret itself: never repeat it.
		return credentialFlag{}, usagef(cmd, "invalid %s: want NAME=env:VAR or NAME=file:PATH", flag)
	case (kind != "env" && kind != "file") || ref == "":
		// src may be the secret itself: never repeat it.
		return credentialFlag{}, usagef(cmd, "invalid %s for credential %q: want NAME=env:VAR or NAME=file:PATH (a value itself is not accepted, so that it stays out of your shell history)", flag, name)
	}
	return credentialFlag{name: name, kind: kind, ref: ref}, nil
}

// maxCredentialFile bounds a credential read from a file.
const maxCredentialFile = 64 << 10

// credential reads the value of a --credential flag from the environment
// or a file. A file's trailing line ending is dropped; an empty value is
// an error. No error says the value.
func (a *app) credential(f credentialFlag) (api.Credential, error) {
	var value string
	switch f.kind {
	case "env":
		value = a.Getenv(f.ref)
		if value == "" {
			return api.Credential{}, fmt.Errorf("credential %q: environment variable %s is empty or unset", f.name, f.ref)
		}
	case "file":
		fh, err := os.Open(f.ref)
		if err != nil {
			return api.Credential{}, fmt.Errorf("credential %q: %w", f.name, err)
		}
		data, err := io.ReadAll(io.LimitReader(fh, maxCredentialFile+1))
		fh.Close()
		if err != nil {
			return api.Credential{}, fmt.Errorf("credential %q: read %s: %w", f.name, f.ref, err)
		}
		if len(data) > maxCredentialFile {
			return api.Credential{}, fmt.Errorf("credential %q: %s is over %d KiB", f.name, f.ref, maxCredentialFile>>10)
		}
		value = strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
		if value == "" {
			return api.Credential{}, fmt.Errorf("credential %q: %s is empty", f.name, f.ref)
		}
	}
	return api.Credential{Name: f.name, Source: api.CredentialSource{Type: "inline", Value: value}}, nil
}

// credentials parses and reads the values of a repeatable credential
// flag.
func (a *app) credentials(cmd *cobra.Command, flag string, specs []string) ([]api.Credential, error) {
	var out []api.Credential
	for _, s := range specs {
		f, err := parseCredentialFlag(cmd, flag, s)
		if err != nil {
			return nil, err
		}
		c, err := a.credential(f)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// readVaultJSON decodes a JSON file ("-" for stdin) into v: no unknown
// keys, nothing after the document. Errors name the file and never quote
// its content.
func (a *app) readVaultJSON(path string, v any) error {
	var data []byte
	var err error
	name := path
	if path == "-" {
		name = "stdin"
		data, err = io.ReadAll(a.In)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: invalid JSON: %v", name, jsonErrorText(err))
	}
	if dec.More() {
		return fmt.Errorf("%s: invalid JSON: data after the document", name)
	}
	return nil
}

// jsonErrorText describes a decoding error without the value that caused
// it: a type error names the field and the type only.
func jsonErrorText(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("%s: cannot be a JSON %s, want %v", te.Field, te.Value, te.Type)
	}
	return err.Error()
}

// addCredentials appends creds to list, refusing a name already there.
func addCredentials(list []api.Credential, creds []api.Credential, what string) ([]api.Credential, error) {
	seen := map[string]bool{}
	for _, c := range list {
		seen[c.Name] = true
	}
	for _, c := range creds {
		if seen[c.Name] {
			return nil, fmt.Errorf("credential %q is given twice (%s)", c.Name, what)
		}
		seen[c.Name] = true
		list = append(list, c)
	}
	return list, nil
}

// vaultDoc is the vault's state as osb shows it.
type vaultDoc struct {
	SandboxID   string           `json:"sandbox_id"`
	Revision    int64            `json:"revision"`
	Credentials []credentialView `json:"credentials"`
	Bindings    []bindingView    `json:"bindings"`
}

// credentialView describes a credential; there is no value to show.
type credentialView struct {
	Name       string `json:"name"`
	SourceType string `json:"source_type"`
	Revision   int64  `json:"revision"`
}

// bindingView describes a binding, its match with every default.
type bindingView struct {
	Name     string          `json:"name"`
	Revision int64           `json:"revision"`
	Hosts    []string        `json:"hosts"`
	Schemes  []string        `json:"schemes"`
	Ports    []int           `json:"ports"`
	Methods  []string        `json:"methods"`
	Paths    []string        `json:"paths"`
	Auth     bindingAuthView `json:"auth"`
}

// bindingAuthView is a binding's auth: its type, and the header of an apiKey
// binding.
type bindingAuthView struct {
	Type   string `json:"type"`
	Header string `json:"header,omitempty"`
}

func viewCredentials(cs []api.CredentialMetadata) []credentialView {
	out := make([]credentialView, 0, len(cs))
	for _, c := range cs {
		out = append(out, credentialView{Name: c.Name, SourceType: c.SourceType, Revision: c.Revision})
	}
	return out
}

func viewBinding(b api.CredentialBindingMetadata) bindingView {
	return bindingView{
		Name: b.Name, Revision: b.Revision,
		Hosts: nonNil(b.Match.Hosts), Schemes: nonNil(b.Match.Schemes), Ports: nonNil(b.Match.Ports),
		Methods: nonNil(b.Match.Methods), Paths: nonNil(b.Match.Paths),
		Auth: bindingAuthView{Type: b.Auth.Type, Header: b.Auth.Name},
	}
}

func viewBindings(bs []api.CredentialBindingMetadata) []bindingView {
	out := make([]bindingView, 0, len(bs))
	for _, b := range bs {
		out = append(out, viewBinding(b))
	}
	return out
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func viewVault(id string, st api.CredentialVaultState) vaultDoc {
	return vaultDoc{SandboxID: id, Revision: st.Revision, Credentials: viewCredentials(st.Credentials), Bindings: viewBindings(st.Bindings)}
}

// text is "bearer", or "apiKey (X-Api-Key)".
func (v bindingAuthView) text() string {
	if v.Header != "" {
		return v.Type + " (" + v.Header + ")"
	}
	return v.Type
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// credentialTable and bindingTable write the vault's lists.
func (p *printer) credentialTable(cs []credentialView) {
	rows := make([][]string, len(cs))
	for i, c := range cs {
		rows[i] = []string{c.Name, c.SourceType, strconv.FormatInt(c.Revision, 10)}
	}
	p.table("Credentials", []string{"NAME", "SOURCE", "REVISION"}, rows, "No credentials.", nil)
}

func (p *printer) bindingTable(bs []bindingView) {
	rows := make([][]string, len(bs))
	for i, b := range bs {
		rows[i] = []string{b.Name, strings.Join(b.Hosts, ","), b.Auth.text(), strings.Join(b.Schemes, ","), joinInts(b.Ports),
			strings.Join(b.Methods, ","), strings.Join(b.Paths, ","), strconv.FormatInt(b.Revision, 10)}
	}
	p.table("Bindings", []string{"NAME", "HOSTS", "AUTH", "SCHEMES", "PORTS", "METHODS", "PATHS", "REVISION"}, rows, "No bindings.", nil)
}

// printVault writes the vault's state under title.
func (a *app) printVault(format, title string, doc vaultDoc) error {
	p := a.printerFor(format)
	return p.doc(doc, func() {
		p.kv(title, [][2]string{{"sandbox_id", doc.SandboxID}, {"revision", strconv.FormatInt(doc.Revision, 10)}})
		fmt.Fprintln(p.out)
		p.credentialTable(doc.Credentials)
		fmt.Fprintln(p.out)
		p.bindingTable(doc.Bindings)
	})
}

func (a *app) vaultCreate() *cobra.Command {
	var file string
	var creds []string
	cmd := formats(&cobra.Command{
		Use:   "create ID [-f FILE|-] [--credential NAME=env:VAR|file:PATH]...",
		Short: "Create a sandbox's credential vault",
		Long: `Create the credential vault of sandbox ID from a JSON file ("-" for stdin)
with its credentials and bindings:

  {"credentials": [{"name": "gh-token", "source": {"type": "inline", "value": "..."}}],
   "bindings": [{"name": "github", "match": {"hosts": ["api.github.com"]},
                 "auth": {"type": "bearer", "credential": "gh-token"}}]}

Each --credential NAME=env:VAR or NAME=file:PATH adds a credential whose value
is read from the environment variable or the file (its trailing newline
dropped), so the file can hold the bindings alone. A binding's auth is
bearer, basic (the value is base64 user:password), apiKey with "name" the
header, or customHeaders; its "credential" names a credential, not a secret.
Match defaults: schemes ["https"], ports [443], every method, paths ["/*"].
Every host must be allowed by an explicit allow rule of the egress policy.`,
		Example: `  osb credential-vault create sb-123 -f bindings.json --credential gh-token=env:GITHUB_TOKEN
  echo '{"bindings": [{"name": "npm", "match": {"hosts": ["registry.npmjs.org"]},
         "auth": {"type": "bearer", "credential": "npm"}}]}' |
    osb vault create sb-123 -f - --credential npm=file:$HOME/.npm-token`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if file == "" && len(creds) == 0 {
				return usagef(cmd, "give the vault with -f FILE, credentials with --credential NAME=env:VAR, or both")
			}
			var req api.CredentialVaultCreateRequest
			if file != "" {
				if err := a.readVaultJSON(file, &req); err != nil {
					return err
				}
			}
			extra, err := a.credentials(cmd, "--credential", creds)
			if err != nil {
				return err
			}
			if req.Credentials, err = addCredentials(req.Credentials, extra, "in the file and with --credential"); err != nil {
				return err
			}
			req.Credentials, req.Bindings = nonNil(req.Credentials), nonNil(req.Bindings)
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			st, err := c.Sandbox(args[0]).Vault().Create(cmd.Context(), req)
			if err != nil {
				return vaultError(err)
			}
			return a.printVault(f, "Credential Vault Created", viewVault(args[0], st))
		},
	}, formatTable, formatJSON, formatYAML)
	fl := cmd.Flags()
	fl.StringVarP(&file, "file", "f", "", `JSON file with the credentials and bindings, "-" for stdin`)
	fl.StringArrayVar(&creds, "credential", nil, "a credential NAME=env:VAR or NAME=file:PATH, its value read from there (repeatable)")
	return cmd
}

func (a *app) vaultGet() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "get ID",
		Short: "Show a sandbox's credential vault",
		Long: `Show the credential vault of sandbox ID: its revision, its credentials (names,
never values) and its bindings with every default of their match filled in.`,
		Example: `  osb credential-vault get sb-123
  osb vault get sb-123 -o json | jq .revision`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			st, err := c.Sandbox(args[0]).Vault().Get(cmd.Context())
			if err != nil {
				return vaultError(err)
			}
			return a.printVault(f, "Credential Vault", viewVault(args[0], st))
		},
	}, formatTable, formatJSON, formatYAML)
}

func (a *app) vaultPatch() *cobra.Command {
	var file string
	var add, replace, delCreds, delBindings []string
	var expected int64
	cmd := formats(&cobra.Command{
		Use:   "patch ID [-f FILE|-] [--credential NAME=SOURCE]... [--replace-credential NAME=SOURCE]...",
		Short: "Change a sandbox's credential vault",
		Long: `Change the credential vault of sandbox ID, all at once or not at all. A JSON
file ("-" for stdin) gives the change:

  {"expectedRevision": 3,
   "credentials": {"add": [...], "replace": [...], "delete": ["old-token"]},
   "bindings":    {"add": [...], "replace": [...], "delete": ["old-binding"]}}

Per collection, deletes apply first, then replacements, then additions. The
flags add to the file's change: --credential NAME=env:VAR|file:PATH adds a
credential, --replace-credential gives an existing one a new value,
--delete-credential and --delete-binding remove by name, and
--expected-revision N refuses the change if the vault is no longer at
revision N (someone else changed it).`,
		Example: `  osb credential-vault patch sb-123 --replace-credential gh-token=env:NEW_GITHUB_TOKEN --expected-revision 1
  osb vault patch sb-123 -f more-bindings.json --credential npm=file:$HOME/.npm-token
  osb vault patch sb-123 --delete-binding npm --delete-credential npm`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if file == "" && len(add)+len(replace)+len(delCreds)+len(delBindings) == 0 {
				return usagef(cmd, "give the change with -f FILE or with --credential, --replace-credential, --delete-credential or --delete-binding")
			}
			var req api.CredentialVaultMutationRequest
			if file != "" {
				if err := a.readVaultJSON(file, &req); err != nil {
					return err
				}
			}
			added, err := a.credentials(cmd, "--credential", add)
			if err != nil {
				return err
			}
			replaced, err := a.credentials(cmd, "--replace-credential", replace)
			if err != nil {
				return err
			}
			if len(added)+len(replaced)+len(delCreds) > 0 {
				if req.Credentials == nil {
					req.Credentials = &api.CredentialMutation{}
				}
				cm := req.Credentials
				if cm.Add, err = addCredentials(cm.Add, added, "to add"); err != nil {
					return err
				}
				if cm.Replace, err = addCredentials(cm.Replace, replaced, "to replace"); err != nil {
					return err
				}
				cm.Delete = append(cm.Delete, trimAll(delCreds)...)
			}
			if len(delBindings) > 0 {
				if req.Bindings == nil {
					req.Bindings = &api.BindingMutation{}
				}
				req.Bindings.Delete = append(req.Bindings.Delete, trimAll(delBindings)...)
			}
			if flagChanged(cmd.Flags(), "expected-revision") {
				if expected < 1 {
					return usagef(cmd, "--expected-revision must be 1 or more")
				}
				req.ExpectedRevision = &expected
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			st, err := c.Sandbox(args[0]).Vault().Patch(cmd.Context(), req)
			if err != nil {
				return vaultError(err)
			}
			return a.printVault(f, "Credential Vault Patched", viewVault(args[0], st))
		},
	}, formatTable, formatJSON, formatYAML)
	fl := cmd.Flags()
	fl.StringVarP(&file, "file", "f", "", `JSON file with the change, "-" for stdin`)
	fl.StringArrayVar(&add, "credential", nil, "add a credential NAME=env:VAR or NAME=file:PATH (repeatable)")
	fl.StringArrayVar(&replace, "replace-credential", nil, "give credential NAME the value of env:VAR or file:PATH (repeatable)")
	fl.StringArrayVar(&delCreds, "delete-credential", nil, "delete credential NAME (repeatable)")
	fl.StringArrayVar(&delBindings, "delete-binding", nil, "delete binding NAME (repeatable)")
	fl.Int64Var(&expected, "expected-revision", 0, "change the vault only if it is at this revision")
	return cmd
}

// trimAll trims each name.
func trimAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = strings.TrimSpace(n)
	}
	return out
}

func (a *app) vaultDelete() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "delete ID",
		Short: "Delete a sandbox's credential vault",
		Long: `Delete the credential vault of sandbox ID: its secrets are forgotten and no
request of the sandbox gets one any more.`,
		Example: `  osb credential-vault delete sb-123`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			if err := c.Sandbox(args[0]).Vault().Delete(cmd.Context()); err != nil {
				return vaultError(err)
			}
			a.printerFor(f).success("deleted the credential vault of sandbox " + args[0])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}

// credentialListDoc is the document of `osb credential-vault credentials`.
type credentialListDoc struct {
	SandboxID   string           `json:"sandbox_id"`
	Revision    int64            `json:"revision"`
	Credentials []credentialView `json:"credentials"`
}

func (a *app) vaultCredentials() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "credentials ID [NAME]",
		Short: "List a vault's credentials, or show one",
		Long: `List the credentials of sandbox ID's vault, or show credential NAME: its name,
source type and the revision that set it. Values are never shown.`,
		Example: `  osb credential-vault credentials sb-123
  osb vault credentials sb-123 gh-token -o json`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			v := c.Sandbox(args[0]).Vault()
			p := a.printerFor(f)
			if len(args) == 2 {
				m, err := v.Credential(cmd.Context(), args[1])
				if err != nil {
					return vaultError(err)
				}
				doc := viewCredentials([]api.CredentialMetadata{m})[0]
				return p.doc(doc, func() {
					p.kv("Credential", [][2]string{{"name", doc.Name}, {"source_type", doc.SourceType}, {"revision", strconv.FormatInt(doc.Revision, 10)}})
				})
			}
			l, err := v.Credentials(cmd.Context())
			if err != nil {
				return vaultError(err)
			}
			doc := credentialListDoc{SandboxID: args[0], Revision: l.Revision, Credentials: viewCredentials(l.Credentials)}
			return p.doc(doc, func() { p.credentialTable(doc.Credentials) })
		},
	}, formatTable, formatJSON, formatYAML)
}

// bindingListDoc is the document of `osb credential-vault bindings`.
type bindingListDoc struct {
	SandboxID string        `json:"sandbox_id"`
	Revision  int64         `json:"revision"`
	Bindings  []bindingView `json:"bindings"`
}

func (a *app) vaultBindings() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "bindings ID [NAME]",
		Short: "List a vault's bindings, or show one",
		Long: `List the bindings of sandbox ID's vault, or show binding NAME: the hosts,
schemes, ports, methods and paths of the requests it matches, and how it
authenticates them (the credential's name is not shown, nor its value).`,
		Example: `  osb credential-vault bindings sb-123
  osb vault bindings sb-123 github -o yaml`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			v := c.Sandbox(args[0]).Vault()
			p := a.printerFor(f)
			if len(args) == 2 {
				b, err := v.Binding(cmd.Context(), args[1])
				if err != nil {
					return vaultError(err)
				}
				doc := viewBinding(b)
				return p.doc(doc, func() {
					p.kv("Binding", [][2]string{
						{"name", doc.Name}, {"hosts", strings.Join(doc.Hosts, ", ")}, {"auth", doc.Auth.text()},
						{"schemes", strings.Join(doc.Schemes, ", ")}, {"ports", joinInts(doc.Ports)},
						{"methods", strings.Join(doc.Methods, ", ")}, {"paths", strings.Join(doc.Paths, ", ")},
						{"revision", strconv.FormatInt(doc.Revision, 10)},
					})
				})
			}
			l, err := v.Bindings(cmd.Context())
			if err != nil {
				return vaultError(err)
			}
			doc := bindingListDoc{SandboxID: args[0], Revision: l.Revision, Bindings: viewBindings(l.Bindings)}
			return p.doc(doc, func() { p.bindingTable(doc.Bindings) })
		},
	}, formatTable, formatJSON, formatYAML)
}
