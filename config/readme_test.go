package config

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// defaultsByKey are the defaults of every key of a table ([server],
// [redis], ...) that holds a value of its own: section.key → the value
// as Default writes it; and the keys that are tables of their own
// (redis.sentinel, tls.certificate).
func defaultsByKey(t *testing.T) (out map[string]string, tables map[string]bool) {
	t.Helper()
	out, tables = map[string]string{}, map[string]bool{}
	c := reflect.ValueOf(Default())
	for sec := range c.Type().Fields() {
		section, _, _ := strings.Cut(sec.Tag.Get("toml"), ",")
		v := c.FieldByIndex(sec.Index)
		if v.Kind() != reflect.Struct || section == "" {
			continue
		}
		for f := range v.Type().Fields() {
			key, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if key == "" || key == "-" {
				continue
			}
			fv := v.FieldByIndex(f.Index)
			if fv.Kind() == reflect.Struct || fv.Kind() == reflect.Slice && fv.Type().Elem().Kind() == reflect.Struct {
				tables[section+"."+key] = true
				continue
			}
			out[section+"."+key] = fmt.Sprint(fv.Interface())
		}
	}
	return out, tables
}

// sameDefault reports whether a documented default (without its quotes
// or backticks) is the value def, as Default holds it: durations and sizes
// by what they mean ("75s" is "1m15s"), lists and the rest as written.
func sameDefault(doc, def string) bool {
	doc, def = strings.Trim(doc, "`\""), strings.Trim(def, "\"")
	if doc == def {
		return true
	}
	if d, err := time.ParseDuration(doc); err == nil {
		e, err := time.ParseDuration(def)
		return err == nil && d == e
	}
	var d, e Size
	if d.UnmarshalText([]byte(doc)) == nil && e.UnmarshalText([]byte(def)) == nil {
		return d == e
	}
	if list, ok := strings.CutPrefix(doc, "["); ok && strings.HasSuffix(list, "]") && list != "]" {
		// ["POST", "PATCH"], as fmt prints []string{"POST", "PATCH"}
		items := strings.Split(strings.TrimSuffix(list, "]"), ",")
		for i, it := range items {
			items[i] = strings.Trim(strings.TrimSpace(it), `"`)
		}
		return def == "["+strings.Join(items, " ")+"]"
	}
	switch doc {
	case "[]":
		return def == "[]" || def == ""
	case "":
		return def == "" || def == "0" || def == "0s" // off
	}
	return false
}

// README's configuration table and the example file give each key's
// default: the one Default holds. (TestEveryKeyDocumented sees that each
// key is there at all.)
func TestDocumentedDefaults(t *testing.T) {
	defs, tables := defaultsByKey(t)
	if len(defs) < 60 {
		t.Fatalf("found %d keys: the walk missed the tags", len(defs))
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+\\.[a-z_0-9]+)` \\| ([^|]*) \\|")
	seen := 0
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		key, doc := m[1], strings.TrimSpace(m[2])
		def, ok := defs[key]
		if !ok {
			if !tables[key] {
				t.Errorf("README's table has %s, which is no key", key)
			}
			continue
		}
		seen++
		if !sameDefault(doc, def) {
			t.Errorf("README: %s defaults to %s, but its default is %q", key, doc, def)
		}
	}
	for key := range defs {
		if !regexp.MustCompile("(?m)^\\| [^|]*`" + regexp.QuoteMeta(key) + "`").Match(readme) {
			t.Errorf("README's configuration table has no row for %s", key)
		}
	}
	if seen < 50 {
		t.Fatalf("read %d rows of README's configuration table: the pattern missed them", seen)
	}

	// The example: each key's "Default:" is the key's default, and a key
	// written (or shown commented out) right after its comment holds it,
	// but where the comment says the example sets another value. The
	// keys of a block default as a file's block does: as Parse fills a
	// block that writes only what is required. A block's keys are
	// examples: only the defaults their comments state are checked.
	blocks, err := Parse([]byte(`
[[ratelimit]]
name = "a"
path = "/a"
limit = 1
window = "1s"
[[ratelimit.override]]
key = "k"
limit = 1
[[idempotency]]
path = "/o"
[[cache]]
path = "/c"
`), "blocks")
	if err != nil {
		t.Fatal(err)
	}
	required := map[string]bool{"ratelimit.name": true, "ratelimit.path": true, "ratelimit.limit": true, "ratelimit.window": true,
		"ratelimit.override.key": true, "ratelimit.override.limit": true, "idempotency.path": true, "cache.path": true}
	block := map[string]bool{}
	for table, v := range map[string]any{"ratelimit": blocks.RateLimits[0], "ratelimit.override": blocks.RateLimits[0].Overrides[0],
		"idempotency": blocks.Idempotency[0], "cache": blocks.Caches[0]} {
		rv := reflect.ValueOf(v)
		for f := range rv.Type().Fields() {
			key, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			fv := rv.FieldByIndex(f.Index)
			if key == "" || key == "-" || fv.Kind() == reflect.Slice && fv.Type().Elem().Kind() == reflect.Struct {
				continue // no key, or a table: [[ratelimit.override]]
			}
			if k := table + "." + key; !required[k] {
				defs[k], block[k] = fmt.Sprint(fv.Interface()), true
			}
		}
	}
	// README's row of a block gives the default of each of its keys in
	// parentheses after it ("`ttl` (24h, ...)", "`algorithm` (`gcra`,
	// `fixed-window`)": the default first), but where it is off or empty.
	for key := range block {
		i := strings.LastIndex(key, ".")
		table, name, def := key[:i], key[i+1:], defs[key]
		switch def {
		case "", "0", "0s", "false", "[]":
			continue
		}
		m := regexp.MustCompile("(?m)^\\| `\\[\\[" + regexp.QuoteMeta(table) + "\\]\\]` \\|.*?`" + name + "` \\(([^()]*)").FindSubmatch(readme)
		if m == nil {
			t.Errorf("README's row of [[%s]] does not give %s its default, %s", table, name, def)
			continue
		}
		tokens := regexp.MustCompile(`[A-Za-z0-9:|._-]+`).FindAllString(strings.ReplaceAll(string(m[1]), `\`, ""), -1)
		want := []string{def}
		if list, ok := strings.CutPrefix(def, "["); ok {
			want = strings.Fields(strings.TrimSuffix(list, "]"))
		}
		for _, w := range want {
			if !slices.ContainsFunc(tokens, func(tok string) bool { return sameDefault(strings.TrimRight(tok, ":."), w) }) {
				t.Errorf("README's row of [[%s]]: %s (%s), but its default is %s", table, name, m[1], def)
			}
		}
	}

	example, err := os.ReadFile("../examples/preforkd.toml")
	if err != nil {
		t.Fatal(err)
	}
	defaultIs := regexp.MustCompile(`Default: (\[[^\]]*\]|"[^"]*"|[^ .,;(]+)`)
	last, checked := "", 0
	for _, k := range exampleKeys(string(example)) {
		def, ok := defs[k.key]
		if !ok || k.key == last && k.commented {
			// a table, a required key; or an example of another
			// value, after the key's default
			continue
		}
		last = k.key
		checked++
		if d := defaultIs.FindStringSubmatch(k.comment); d != nil && !sameDefault(d[1], def) {
			t.Errorf("examples/preforkd.toml:%d: %s says Default: %s, but its default is %q", k.ln, k.key, d[1], def)
		}
		if !block[k.key] && !sameDefault(k.value, def) && !strings.Contains(k.comment, "Default:") {
			t.Errorf("examples/preforkd.toml:%d: %s = %s, not its default %q, with no Default: to say so", k.ln, k.key, k.value, def)
		}
	}
	if checked < 90 {
		t.Fatalf("checked the defaults of %d keys of the example: the scan misreads it", checked)
	}
}

// The TOML examples in README (```toml blocks) are files the parser
// takes: no key misspelt, renamed or of the wrong type.
func TestReadmeExamplesParse(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(readme), "\n```toml\n")[1:]
	if len(blocks) < 3 {
		t.Fatalf("found %d TOML examples in README: the scan misreads it", len(blocks))
	}
	for _, b := range blocks {
		src, _, ok := strings.Cut(b, "\n```")
		if !ok {
			t.Fatalf("a TOML example in README does not end:\n%s", b)
		}
		if _, err := Parse([]byte(src+"\n"), "README"); err != nil {
			t.Errorf("README's example does not parse: %v\n%s", err, src)
		}
	}
}
