package config

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// The value decoders check a TOML value's type and convert it, reporting
// problems at the line of its key. A value in error leaves dst unchanged.

func (d *decoder) str(path []string, v any, dst *string) {
	s, ok := v.(string)
	if !ok {
		d.fail(path, "%s: want a string, got %s", name(path), typeName(v))
		return
	}
	*dst = s
}

func (d *decoder) int64(path []string, v any, dst *int64) {
	n, ok := v.(int64)
	if !ok {
		d.fail(path, "%s: want an integer, got %s", name(path), typeName(v))
		return
	}
	*dst = n
}

// intRange decodes an int-sized integer. Values out of int's range are
// clamped, so that the range check names a number of the right sign.
func (d *decoder) intRange(path []string, v any, dst *int) {
	var n int64
	d.int64(path, v, &n)
	*dst = int(max(min(n, math.MaxInt), math.MinInt))
}

func (d *decoder) strings(path []string, v any) []string {
	a, ok := v.([]any)
	if !ok {
		d.fail(path, "%s: want an array of strings, got %s", name(path), typeName(v))
		return nil
	}
	out := make([]string, 0, len(a))
	for i, e := range a {
		s, ok := e.(string)
		if !ok {
			d.fail(path, "%s[%d]: want a string, got %s", name(path), i+1, typeName(e))
			continue
		}
		out = append(out, s)
	}
	return out
}

// methods decodes a method list, upper-cased; [] stays a non-nil empty slice.
func (d *decoder) methods(path []string, v any) []string {
	ms := d.strings(path, v)
	for i := range ms {
		ms[i] = strings.ToUpper(ms[i])
	}
	return ms
}

func (d *decoder) duration(path []string, v any, dst *time.Duration) {
	s, ok := v.(string)
	if !ok {
		d.fail(path, "%s: want a duration string such as \"30s\", \"5m\" or \"1h30m\", got %s", name(path), typeName(v))
		return
	}
	t, err := time.ParseDuration(s)
	if err != nil {
		d.fail(path, "%s: invalid duration %q: want Go syntax such as \"30s\", \"5m\" or \"1h30m\"", name(path), s)
		return
	}
	*dst = t
}

func (d *decoder) size(path []string, v any, dst *int64) {
	switch v := v.(type) {
	case int64:
		if v < 0 {
			d.fail(path, "%s: negative size %d", name(path), v)
			return
		}
		*dst = v
	case string:
		n, err := parseSize(v)
		if err != nil {
			d.fail(path, "%s: %v", name(path), err)
			return
		}
		*dst = n
	default:
		d.fail(path, "%s: want a size (bytes, or a string such as \"64KiB\" or \"1MB\"), got %s", name(path), typeName(v))
	}
}

func (d *decoder) prefixes(path []string, v any) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range d.strings(path, v) {
		p, err := parsePrefix(s)
		if err != nil {
			d.fail(path, "%s[%d]: %v", name(path), i+1, err)
			continue
		}
		out = append(out, p)
	}
	return out
}

// parsePrefix parses a CIDR, or a bare address as a single-host prefix. Host
// bits are cleared: "10.1.2.3/8" is 10.0.0.0/8.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("invalid CIDR %q", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("invalid IP address or CIDR %q", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

var sizeUnits = map[string]int64{
	"": 1, "B": 1,
	"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
}

// parseSize parses "512", "64KiB", "1MiB", "10KB": a whole number of bytes
// with an optional decimal (KB, MB, GB, TB) or binary (KiB, ...) unit.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && isDigit(t[i]) {
		i++
	}
	unit, ok := sizeUnits[strings.TrimSpace(t[i:])]
	if i == 0 || !ok {
		return 0, fmt.Errorf("invalid size %q: want a whole number of bytes with an optional unit B, KB, MB, GB, TB, KiB, MiB, GiB or TiB", s)
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil || n > math.MaxInt64/unit {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n * unit, nil
}

func typeName(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case int64:
		return "integer"
	case float64:
		return "float"
	case bool:
		return "boolean"
	case []any:
		return "array"
	case map[string]any:
		return "table"
	case []map[string]any:
		return "array of tables"
	case nil:
		return "nothing"
	default:
		return "date-time"
	}
}

// suggest returns ` (did you mean "x"?)` for a known key close to k.
func suggest(k string, known []string) string {
	best, bestDist := "", 3
	for _, c := range known {
		dist := editDistance(strings.ToLower(k), c)
		if dist < bestDist {
			best, bestDist = c, dist
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
