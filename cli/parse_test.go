package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"
)

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"90": 90 * time.Second, "0": 0, "10m": 10 * time.Minute, "1h30m": 90 * time.Minute,
		"1h5s": time.Hour + 5*time.Second, " 2h ": 2 * time.Hour, "1.5h": 90 * time.Minute, "500ms": 500 * time.Millisecond,
	} {
		if got, err := parseDuration(in); err != nil || got != want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "1d", "10M", "m10", "-5m", "-5", "10x", "1h 30m", "soon"} {
		if d, err := parseDuration(bad); err == nil {
			t.Errorf("parseDuration(%q) = %v, want an error", bad, d)
		}
	}
	if _, none, err := parseLifetime(" NONE "); !none || err != nil {
		t.Errorf("none: %v %v", none, err)
	}
	if _, _, err := parseLifetime("0"); err == nil {
		t.Error("a zero lifetime was accepted")
	}
}

func TestParseKeyValues(t *testing.T) {
	cmd := &cobra.Command{Use: "x"}
	got, err := parseKeyValues(cmd, "--env", []string{"A=1", "B=x=y", "C=", "A=2"})
	if err != nil || len(got) != 3 || got["A"] != "2" || got["B"] != "x=y" || got["C"] != "" {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"FOO", "=v"} {
		if _, err := parseKeyValues(cmd, "--env", []string{bad}); err == nil || !strings.Contains(err.Error(), "want KEY=VALUE") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]uint32{"644": 0o644, "0755": 0o755, "4755": 0o4755, "0o700": 0o700, "0": 0} {
		if got, err := parseMode(in); err != nil || got != want {
			t.Errorf("parseMode(%q) = %o, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "8", "rwx", "77777", "-1"} {
		if _, err := parseMode(bad); err == nil {
			t.Errorf("parseMode(%q) accepted", bad)
		}
	}
}

func TestRemotePath(t *testing.T) {
	for _, tc := range []struct {
		arg, id, path string
		remote        bool
	}{
		{"sb1:/tmp/x", "sb1", "/tmp/x", true},
		{"sb1:", "sb1", ".", true},
		{"./a:b", "", "./a:b", false},
		{"/abs:x", "", "/abs:x", false},
		{"dir/file", "", "dir/file", false},
		{"a/b:c", "", "a/b:c", false},
		{"-", "", "-", false},
	} {
		id, path, remote := remotePath(tc.arg)
		if id != tc.id || path != tc.path || remote != tc.remote {
			t.Errorf("remotePath(%q) = %q, %q, %v", tc.arg, id, path, remote)
		}
	}
}

func TestClockText(t *testing.T) {
	for d, want := range map[time.Duration]string{
		30 * time.Minute: "0:30:00", 90 * time.Second: "0:01:30", 24 * time.Hour: "1 day, 0:00:00", 49*time.Hour + time.Second: "2 days, 1:00:01",
	} {
		if got := clockText(d); got != want {
			t.Errorf("clockText(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestSetConfigValue(t *testing.T) {
	for _, tc := range []struct{ name, text, section, field, value, want string }{
		{"uncomments", "[connection]\n# domain = \"x\"\n", "connection", "domain", `"h:1"`, "[connection]\ndomain = \"h:1\"\n"},
		{"real line wins", "[connection]\n# domain = \"x\"\ndomain = \"y\"\n", "connection", "domain", `"z"`, "[connection]\n# domain = \"x\"\ndomain = \"z\"\n"},
		{"adds to section", "[connection]\napi_key = \"k\"\n\n[output]\n", "connection", "domain", `"d"`, "[connection]\napi_key = \"k\"\ndomain = \"d\"\n\n[output]\n"},
		{"adds section", "[connection]\n", "defaults", "image", `"i"`, "[connection]\n\n[defaults]\nimage = \"i\"\n"},
		{"empty file", "", "output", "color", "false", "[output]\ncolor = false\n"},
		{"other section's key untouched", "[a]\nimage = 1\n[defaults]\n", "defaults", "image", `"i"`, "[a]\nimage = 1\n[defaults]\nimage = \"i\"\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := setConfigValue(tc.text, tc.section, tc.field, tc.value); got != tc.want {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// FuzzConfigSet edits arbitrary files with values rendered by
// tomlValue: the result is valid TOML whenever the input was, and holds
// the value set.
func FuzzConfigSet(f *testing.F) {
	f.Add(configTemplate, "connection.api_key", `we"ird\key`)
	f.Add("[connection]\ndomain = \"a\"\n", "connection.domain", "b\nc")
	f.Add("", "defaults.image", "python:3.11")
	f.Fuzz(func(t *testing.T, text, key, value string) {
		k, ok := configKeys[key]
		if !ok {
			return
		}
		var before map[string]any
		if _, err := toml.Decode(text, &before); err != nil {
			return
		}
		rendered, err := tomlValue(k, value)
		if err != nil {
			return
		}
		section, field, _ := strings.Cut(key, ".")
		out := setConfigValue(text, section, field, rendered)
		var after map[string]any
		if _, err := toml.Decode(out, &after); err != nil {
			return // a key defined twice in the input stays the user's to fix; the command then refuses
		}
		tbl, _ := after[section].(map[string]any)
		if k.kind == "string" && tbl[field] != value {
			t.Errorf("after setting %s = %q the file holds %v:\n%s", key, value, tbl[field], out)
		}
	})
}

func TestTOMLString(t *testing.T) {
	for _, s := range []string{"plain", `q"uote`, `back\slash`, "new\nline", "tab\t", "\x01ctl", "ünï"} {
		var v struct{ K string }
		if _, err := toml.Decode("K = "+tomlString(s), &v); err != nil || v.K != s {
			t.Errorf("tomlString(%q) = %s decodes to %q, %v", s, tomlString(s), v.K, err)
		}
	}
}
