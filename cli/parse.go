package cli

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// hmsRE is the duration syntax of the other OpenSandbox CLIs: hours,
// minutes and seconds, each optional, in that order.
var hmsRE = regexp.MustCompile(`^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$`)

// parseDuration reads a duration: whole seconds ("90"), the h/m/s form
// ("1h30m", "90s"), or any Go duration ("1.5h", "500ms").
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty duration")
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("invalid duration %q: must not be negative", s)
		}
		return time.Duration(n) * time.Second, nil
	}
	if m := hmsRE.FindStringSubmatch(s); m != nil {
		var d time.Duration
		for i, unit := range []time.Duration{time.Hour, time.Minute, time.Second} {
			if m[i+1] != "" {
				n, _ := strconv.ParseInt(m[i+1], 10, 64)
				d += time.Duration(n) * unit
			}
		}
		return d, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("invalid duration %q: use a form like 90s, 10m or 1h30m", s)
	}
	return d, nil
}

// parseLifetime reads a sandbox lifetime: a duration of at least a second,
// or "none" for a sandbox that lives until killed (none = true).
func parseLifetime(s string) (d time.Duration, none bool, err error) {
	if strings.EqualFold(strings.TrimSpace(s), "none") {
		return 0, true, nil
	}
	d, err = parseDuration(s)
	if err == nil && d < time.Second {
		err = fmt.Errorf("invalid timeout %q: at least 1s, or none", s)
	}
	return d, false, err
}

// parseKeyValues reads KEY=VALUE pairs, split at the first "=".
func parseKeyValues(cmd *cobra.Command, flag string, pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, usagef(cmd, "invalid %s %q: want KEY=VALUE", flag, p)
		}
		out[k] = v
	}
	return out, nil
}

// parseMode reads a permission mode given as octal digits: "644",
// "0755", "4755".
func parseMode(s string) (uint32, error) {
	s = strings.TrimSpace(s)
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0"), 8, 32)
	if s == "0" || s == "000" {
		v, err = 0, nil
	}
	if err != nil || v > 0o7777 {
		return 0, fmt.Errorf("invalid mode %q: use octal digits such as 644 or 755", s)
	}
	return uint32(v), nil
}

// durationValue is a pflag.Value for a duration in the syntax above.
type durationValue struct {
	d   *time.Duration
	set bool
}

func (v *durationValue) String() string {
	if v.d == nil || *v.d == 0 {
		return ""
	}
	return v.d.String()
}

func (v *durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.d, v.set = d, true
	return nil
}

func (v *durationValue) Type() string { return "duration" }

func sortStrings(s []string) { slices.Sort(s) }
