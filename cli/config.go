package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/sdk"
)

// settings are the connection and defaults osb runs with, resolved from
// flags, then the environment, then the configuration file.
type settings struct {
	APIKey         string
	Domain         string
	Protocol       string
	RequestTimeout time.Duration
	UseServerProxy bool
	// Color is the file's [output] color; nil when unset (on).
	Color          *bool
	DefaultImage   string
	DefaultTimeout string

	ConfigPath   string
	ConfigExists bool
}

func (s settings) colorSetting() bool { return s.Color == nil || *s.Color }

// fileConfig is ~/.opensandbox/config.toml. Every key is optional.
type fileConfig struct {
	Connection struct {
		APIKey         *string `toml:"api_key"`
		Domain         *string `toml:"domain"`
		Protocol       *string `toml:"protocol"`
		RequestTimeout any     `toml:"request_timeout"` // seconds, or a duration string
		UseServerProxy *bool   `toml:"use_server_proxy"`
	} `toml:"connection"`
	Output struct {
		Color *bool `toml:"color"`
	} `toml:"output"`
	Defaults struct {
		Image   *string `toml:"image"`
		Timeout any     `toml:"timeout"` // a duration string, "none", or seconds
	} `toml:"defaults"`
}

// annNoConfig marks the commands that must work with a broken config
// file: the config commands themselves.
const annNoConfig = "osb.noconfig"

// defaultConfigPath is ~/.opensandbox/config.toml.
func (a *app) defaultConfigPath() string {
	home := a.Getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".opensandbox", "config.toml")
}

// loadConfig reads a configuration file; a missing file is an empty one.
func loadConfig(path string) (*fileConfig, bool, error) {
	var fc fileConfig
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &fc, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read config: %w", err)
	}
	if _, err := toml.Decode(string(data), &fc); err != nil {
		return nil, true, fmt.Errorf("config %s: %w", path, err)
	}
	return &fc, true, nil
}

// timeoutValue reads a seconds-or-duration value of the file.
func timeoutValue(v any, key string) (time.Duration, error) {
	switch t := v.(type) {
	case nil:
		return 0, nil
	case int64:
		if t > 0 {
			return time.Duration(t) * time.Second, nil
		}
	case float64:
		if t > 0 {
			return time.Duration(t * float64(time.Second)), nil
		}
	case string:
		if d, err := sdk.ParseSeconds(t); err == nil {
			return d, nil
		}
	}
	return 0, fmt.Errorf("%s = %v: want a positive number of seconds or a duration such as \"30s\"", key, v)
}

// resolve fills a.set from flags, environment and file, in that order of
// precedence, before any command runs.
func (a *app) resolve(cmd *cobra.Command) error {
	path := a.global.configPath
	if path == "" {
		path = a.defaultConfigPath()
	}
	a.set = settings{ConfigPath: path}
	fc := &fileConfig{}
	if !hasAnnotation(cmd, annNoConfig) {
		var err error
		if fc, a.set.ConfigExists, err = loadConfig(path); err != nil {
			return err
		}
	}
	return a.applySettings(cmd, fc)
}

// applySettings resolves every setting from flags, environment and fc.
func (a *app) applySettings(cmd *cobra.Command, fc *fileConfig) error {
	s := &a.set
	flags := cmd.Flags()
	env := func(name string) string { return strings.TrimSpace(a.Getenv(name)) }

	s.APIKey = first(a.global.apiKey, a.Getenv(sdk.EnvAPIKey), deref(fc.Connection.APIKey))
	s.Domain = first(a.global.domain, env(sdk.EnvDomain), deref(fc.Connection.Domain))
	s.Protocol = strings.ToLower(first(a.global.protocol, env(sdk.EnvProtocol), deref(fc.Connection.Protocol)))
	if s.Protocol != "" && s.Protocol != "http" && s.Protocol != "https" {
		return fmt.Errorf("protocol %q: want http or https", s.Protocol)
	}

	switch {
	case a.global.requestTimeout != "":
		d, err := sdk.ParseSeconds(a.global.requestTimeout)
		if err != nil {
			return usagef(cmd, "--request-timeout %q: %v", a.global.requestTimeout, err)
		}
		s.RequestTimeout = d
	case env(sdk.EnvRequestTimeout) != "":
		d, err := sdk.ParseSeconds(env(sdk.EnvRequestTimeout))
		if err != nil {
			return fmt.Errorf("%s=%q: %v", sdk.EnvRequestTimeout, env(sdk.EnvRequestTimeout), err)
		}
		s.RequestTimeout = d
	default:
		d, err := timeoutValue(fc.Connection.RequestTimeout, "connection.request_timeout")
		if err != nil {
			return fmt.Errorf("config %s: %w", s.ConfigPath, err)
		}
		s.RequestTimeout = d
	}

	switch {
	case flagChanged(flags, "use-server-proxy"):
		s.UseServerProxy = true
	case flagChanged(flags, "no-use-server-proxy"):
		s.UseServerProxy = false
	case env(sdk.EnvUseServerProxy) != "":
		b, ok := sdk.ParseBool(env(sdk.EnvUseServerProxy))
		if !ok {
			return fmt.Errorf("%s=%q: want true or false", sdk.EnvUseServerProxy, env(sdk.EnvUseServerProxy))
		}
		s.UseServerProxy = b
	case fc.Connection.UseServerProxy != nil:
		s.UseServerProxy = *fc.Connection.UseServerProxy
	}

	s.Color = fc.Output.Color
	s.DefaultImage = deref(fc.Defaults.Image)
	switch t := fc.Defaults.Timeout.(type) {
	case nil:
	case string:
		if _, _, err := parseLifetime(t); err != nil {
			return fmt.Errorf("config %s: defaults.timeout = %q: %v", s.ConfigPath, t, err)
		}
		s.DefaultTimeout = t
	case int64:
		s.DefaultTimeout = strconv.FormatInt(t, 10)
	default:
		return fmt.Errorf("config %s: defaults.timeout = %v: want a duration such as \"10m\", or \"none\"", s.ConfigPath, t)
	}
	return nil
}

func first(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func hasAnnotation(cmd *cobra.Command, key string) bool {
	for c := cmd; c != nil; c = c.Parent() {
		if _, ok := c.Annotations[key]; ok {
			return true
		}
	}
	return false
}

// configTemplate is what `osb config init` writes: every key, commented
// out, so that a fresh file changes nothing until edited.
const configTemplate = `# OpenSandbox CLI configuration.
# Precedence: command-line flags, then OPEN_SANDBOX_* environment variables, then this file.

[connection]
# api_key = "your-api-key"
# domain = "localhost:8080"
# protocol = "http"
# request_timeout = 30
# use_server_proxy = false

[output]
# color = true

[defaults]
# image = "python:3.11"
# timeout = "10m"        # "none": the sandbox lives until it is killed
`

// configKey describes one key `osb config set` accepts.
type configKey struct {
	kind  string // "string", "int", "bool"
	check func(string) error
}

var configKeys = map[string]configKey{
	"connection.api_key":          {kind: "string"},
	"connection.domain":           {kind: "string"},
	"connection.protocol":         {kind: "string", check: checkProtocol},
	"connection.request_timeout":  {kind: "int", check: checkPositiveInt},
	"connection.use_server_proxy": {kind: "bool"},
	"output.color":                {kind: "bool"},
	"defaults.image":              {kind: "string"},
	"defaults.timeout": {kind: "string", check: func(v string) error {
		_, _, err := parseLifetime(v)
		return err
	}},
}

func checkProtocol(v string) error {
	if v != "http" && v != "https" {
		return fmt.Errorf("want http or https")
	}
	return nil
}

func checkPositiveInt(v string) error {
	if n, err := strconv.Atoi(v); err != nil || n <= 0 {
		return fmt.Errorf("want a positive whole number of seconds")
	}
	return nil
}

// tomlValue renders a value for key in TOML.
func tomlValue(k configKey, v string) (string, error) {
	if !utf8.ValidString(v) {
		return "", fmt.Errorf("not valid UTF-8")
	}
	if k.check != nil {
		if err := k.check(v); err != nil {
			return "", err
		}
	}
	switch k.kind {
	case "bool":
		b, ok := sdk.ParseBool(v)
		if !ok {
			return "", fmt.Errorf("want true or false")
		}
		return strconv.FormatBool(b), nil
	case "int":
		return v, nil
	}
	return tomlString(v), nil
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// setConfigValue edits the text of a configuration file so that
// section.field = value, keeping every other line and comment: the
// field's line (commented out or not) in the section is replaced, or
// added at the section's end, or the section is added.
func setConfigValue(text, section, field, value string) string {
	lines := strings.Split(text, "\n")
	header := regexp.MustCompile(`^\s*\[\s*` + regexp.QuoteMeta(section) + `\s*\]\s*(#.*)?$`)
	keyLine := regexp.MustCompile(`^\s*#?\s*` + regexp.QuoteMeta(field) + `\s*=`)
	start := slices.IndexFunc(lines, func(l string) bool { return header.MatchString(l) })
	if start < 0 {
		text = strings.TrimRight(text, "\n")
		if text != "" {
			text += "\n\n"
		}
		return text + "[" + section + "]\n" + field + " = " + value + "\n"
	}
	end := len(lines)
	for i := start + 1; i < len(lines); i++ {
		if strings.HasPrefix(strings.TrimSpace(lines[i]), "[") {
			end = i
			break
		}
	}
	// The key's own line wins over a commented-out one.
	active := regexp.MustCompile(`^\s*` + regexp.QuoteMeta(field) + `\s*=`)
	for _, re := range []*regexp.Regexp{active, keyLine} {
		for i := start + 1; i < end; i++ {
			if re.MatchString(lines[i]) {
				lines[i] = field + " = " + value
				return strings.Join(lines, "\n")
			}
		}
	}
	insert := end
	for insert > start+1 && strings.TrimSpace(lines[insert-1]) == "" {
		insert--
	}
	lines = slices.Insert(lines, insert, field+" = "+value)
	return strings.Join(lines, "\n")
}

// writeFileAtomic replaces path with data, private to the user (the file
// may hold an API key).
func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.toml")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// configCommand is `osb config`.
func (a *app) configCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:         "config",
		Short:       "Create, show and edit the configuration file",
		Annotations: map[string]string{annNoConfig: "1"},
	}
	var force bool
	initCmd := formats(&cobra.Command{
		Use:   "init",
		Short: "Write a commented configuration file (all keys unset)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			p := a.printerFor(f)
			path := a.set.ConfigPath
			if _, err := os.Stat(path); err == nil && !force {
				p.warn("Config file already exists at " + path + ". Use --force to overwrite.")
				return nil
			}
			if err := writeFileAtomic(path, []byte(configTemplate)); err != nil {
				return fmt.Errorf("write config: %w", err)
			}
			p.success("Config file created: " + path)
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
	initCmd.Flags().BoolVar(&force, "force", false, "overwrite an existing file")

	show := formats(&cobra.Command{
		Use:   "show",
		Short: "Show the settings in effect and where they come from",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			fc, exists, err := loadConfig(a.set.ConfigPath)
			if err != nil {
				return err
			}
			a.set.ConfigExists = exists
			if err := a.applySettings(cmd, fc); err != nil {
				return err
			}
			return a.printPrinterConfig(a.printerFor(f))
		},
	}, formatTable, formatJSON, formatYAML)

	set := formats(&cobra.Command{
		Use:   "set KEY VALUE",
		Short: "Set one key, such as connection.domain or defaults.image",
		Long: "Set one key of the configuration file, keeping its comments. Keys: " +
			strings.Join(sortedKeys(), ", ") + ".",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			key, value := args[0], args[1]
			k, ok := configKeys[key]
			if !ok {
				return fmt.Errorf("unknown key %q; keys: %s", key, strings.Join(sortedKeys(), ", "))
			}
			rendered, err := tomlValue(k, value)
			if err != nil {
				return fmt.Errorf("%s %q: %v", key, value, err)
			}
			path := a.set.ConfigPath
			data, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("config file not found: %s. Run 'osb config init' first", path)
			} else if err != nil {
				return fmt.Errorf("read config: %w", err)
			}
			section, field, _ := strings.Cut(key, ".")
			out := setConfigValue(string(data), section, field, rendered)
			var check fileConfig
			if _, err := toml.Decode(out, &check); err != nil {
				return fmt.Errorf("config %s is not valid TOML, so it was left as it is: %v", path, err)
			}
			if err := writeFileAtomic(path, []byte(out)); err != nil {
				return fmt.Errorf("write config: %w", err)
			}
			shown := value
			if key == "connection.api_key" {
				shown = maskKey(value)
			}
			a.printerFor(f).success("Set " + key + " = " + shown)
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.AddCommand(initCmd, show, set)
	return cmd
}

func sortedKeys() []string {
	keys := make([]string, 0, len(configKeys))
	for k := range configKeys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// configDoc is the document of `osb config show`.
type configDoc struct {
	APIKey           *string `json:"api_key"`
	Domain           string  `json:"domain"`
	Protocol         string  `json:"protocol"`
	RequestTimeout   float64 `json:"request_timeout"`
	UseServerProxy   bool    `json:"use_server_proxy"`
	Color            bool    `json:"color"`
	DefaultImage     *string `json:"default_image"`
	DefaultTimeout   *string `json:"default_timeout"`
	ConfigPath       string  `json:"config_path"`
	ConfigFileExists bool    `json:"config_file_exists"`
}

// maskKey shows the first and last two characters of a key.
func maskKey(k string) string {
	if len(k) <= 4 {
		return strings.Repeat("*", len(k))
	}
	return k[:2] + strings.Repeat("*", len(k)-4) + k[len(k)-2:]
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (a *app) printPrinterConfig(p *printer) error {
	s := a.set
	doc := configDoc{
		Domain:           first(s.Domain, sdk.DefaultDomain),
		Protocol:         first(s.Protocol, sdk.DefaultProtocol),
		RequestTimeout:   s.RequestTimeout.Seconds(),
		UseServerProxy:   s.UseServerProxy,
		Color:            s.colorSetting(),
		DefaultImage:     optional(s.DefaultImage),
		DefaultTimeout:   optional(s.DefaultTimeout),
		ConfigPath:       s.ConfigPath,
		ConfigFileExists: s.ConfigExists,
	}
	if doc.RequestTimeout == 0 {
		doc.RequestTimeout = sdk.DefaultRequestTimeout.Seconds()
	}
	if s.APIKey != "" {
		m := maskKey(s.APIKey)
		doc.APIKey = &m
	}
	return p.doc(doc, func() {
		p.kv("Resolved Configuration", [][2]string{
			{"api_key", deref(doc.APIKey)},
			{"domain", doc.Domain},
			{"protocol", doc.Protocol},
			{"request_timeout", strconv.FormatFloat(doc.RequestTimeout, 'f', -1, 64)},
			{"use_server_proxy", strconv.FormatBool(doc.UseServerProxy)},
			{"color", strconv.FormatBool(doc.Color)},
			{"default_image", deref(doc.DefaultImage)},
			{"default_timeout", deref(doc.DefaultTimeout)},
			{"config_path", doc.ConfigPath},
			{"config_file_exists", strconv.FormatBool(doc.ConfigFileExists)},
		})
	})
}
