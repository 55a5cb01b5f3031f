package config

import (
	"encoding"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/preforkd/preforkd/bucket"
)

// Load reads the file at path and parses it with [Parse], then reads the
// files it names: for secrets ([Redis] password_file, sentinel_password_file
// and ca_file), for the application's version ([Persist] key_file) and the
// TLS certificates and keys ([[tls.certificate]]). A file that cannot be read gives an error that wraps the
// one from the file system (so errors.Is(err, fs.ErrNotExist) works); a
// bad file, or a named one that cannot be used, gives an *Error.
func Load(path string) (Config, error) {
	c, _, err := load(path, nil)
	return c, err
}

// LoadReload is Load for a reload of the running configuration: a
// [[tls.certificate]] whose files cannot be used (a renewal half
// written, a key that is not the certificate's) keeps running's
// certificate at its place instead of refusing the file; kept says which
// and why. Anything else refuses the file as Load does.
func LoadReload(path string, running Config) (c Config, kept []error, err error) {
	return load(path, &running.TLS)
}

func load(path string, runningTLS *TLS) (Config, []error, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data, path)
	if err != nil {
		return c, nil, err
	}
	// The files the configuration names, read now so that a missing or
	// unsafe one refuses the configuration (at start, in check, at a
	// reload) at the line of its key.
	r := &report{file: path, src: string(data)}
	c.Redis.readFiles(r)
	c.Persist.readFiles(r)
	kept := c.TLS.readFiles(r, runningTLS)
	if err := r.first(); err != nil {
		return c, nil, err
	}
	c.Redis.check(r) // a password in a URL and in a file, say
	return c, kept, r.first()
}

// Parse parses a TOML configuration, fills in the defaults and validates the
// result. name is the file name used in errors. Every problem is an *Error
// carrying the line of the offending key; when there are several, the one
// that comes first in the file is reported.
//
// The file is read in three steps. The TOML decoder parses it; then its
// tree is compared with the types of [Config], key by key, so that every
// unknown key, value of the wrong type and value its type refuses is
// found with its path (the decoder would match "Listen" to listen, stop
// at its first problem, and not say which [[ratelimit]] it was in); then
// the decoder fills a Config that starts from the defaults, and
// [Config.Validate]'s checks run on it.
func Parse(data []byte, name string) (Config, error) {
	var doc toml.Primitive
	md, err := toml.Decode(string(data), &doc)
	if err != nil {
		return Config{}, decodeError(name, err, string(data))
	}
	r := &report{file: name, src: string(data)}
	var tree map[string]any
	if err := md.PrimitiveDecode(doc, &tree); err != nil {
		return Config{}, decodeError(name, err)
	}
	r.shape(nil, tree, reflect.TypeFor[Config]())
	if err := r.first(); err != nil {
		return Config{}, err
	}
	c, err := decode(&md, doc)
	if err != nil {
		return Config{}, decodeError(name, err) // the shape check let through what the decoder refuses
	}
	c.windowSeconds(tree)
	if t, ok := tree["tls"].(map[string]any); ok {
		_, c.TLS.cleartextSet = t["cleartext"]
		_, c.TLS.redirectPortSet = t["redirect_port"]
	}
	c.check(r)
	if err := r.first(); err != nil {
		return Config{}, err
	}
	return c.WithDefaults(), nil
}

// decode fills a Config from the defaults and the file. Each element of an
// array of tables starts from its own defaults, so that a key the file
// leaves out takes its default while one set to "" or 0 is checked as such.
func decode(md *toml.MetaData, doc toml.Primitive) (Config, error) {
	var f struct {
		Config
		RateLimits  []toml.Primitive `toml:"ratelimit"`
		Idempotency []toml.Primitive `toml:"idempotency"`
		Caches      []toml.Primitive `toml:"cache"`
	}
	f.Config = Default()
	err := md.PrimitiveDecode(doc, &f)
	c := f.Config
	for _, p := range f.RateLimits {
		rl := RateLimit{}.withDefaults()
		err = errors.Join(err, md.PrimitiveDecode(p, &rl))
		c.RateLimits = append(c.RateLimits, rl)
	}
	for _, p := range f.Idempotency {
		d := Idempotency{Wait: defaultIdemWait}.withDefaults()
		err = errors.Join(err, md.PrimitiveDecode(p, &d))
		c.Idempotency = append(c.Idempotency, d)
	}
	for _, p := range f.Caches {
		d := Cache{LockTimeout: defaultCacheLock}.withDefaults()
		d.TagHeaders = nil // the file's value, or the default after decoding
		err = errors.Join(err, md.PrimitiveDecode(p, &d))
		if d.TagHeaders == nil {
			// Only this default: ttl = "0s" and their kin are checked as
			// written, not taken for the default.
			d.TagHeaders = defaultTagHeaders()
		}
		d.Methods = upperAll(d.Methods)
		c.Caches = append(c.Caches, d)
	}
	return c, err
}

// inSeconds reports whether the duration at path may be written as a
// bare integer, a number of seconds: a rule's window and an override's,
// as limit_req-style configurations write them ("window = 300").
func inSeconds(path []string) bool { return len(path) > 0 && path[len(path)-1] == "window" }

// maxWholeSeconds is the longest window written in seconds: the longest
// a rule takes (bucket.MaxWindow), far below what a time.Duration holds.
const maxWholeSeconds = int64(bucket.MaxWindow / time.Second)

// windowSeconds makes each window the file wrote as a bare integer that
// many seconds: the decoder took it for nanoseconds.
func (c *Config) windowSeconds(tree map[string]any) {
	rules := tables(tree["ratelimit"])
	for i, m := range rules {
		if i >= len(c.RateLimits) {
			break
		}
		rl := &c.RateLimits[i]
		if n, ok := m["window"].(int64); ok {
			rl.Window = time.Duration(n) * time.Second
		}
		for j, o := range tables(m["override"]) {
			if n, ok := o["window"].(int64); ok && j < len(rl.Overrides) {
				rl.Overrides[j].Window = time.Duration(n) * time.Second
			}
		}
	}
}

// tables is v as the decoder gives an array of tables: []map[string]any
// for [[name]] blocks, []any of maps for an inline array (name = [{...}]).
func tables(v any) []map[string]any {
	switch a := v.(type) {
	case []map[string]any:
		return a
	case []any:
		out := make([]map[string]any, len(a))
		for i, e := range a {
			out[i], _ = e.(map[string]any)
		}
		return out
	}
	return nil
}

func decodeError(name string, err error, src ...string) *Error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg := pe.Message
		if n, ok := strings.CutSuffix(msg, " is out of range for int64"); ok && pe.LastKey != "" && len(src) > 0 {
			// The decoder names the type, not the key.
			msg = fmt.Sprintf("%s: %s is out of range: an integer is from %d to %d", arrayKey(src[0], pe.Position.Line, pe.LastKey), n, math.MinInt64, math.MaxInt64)
		}
		return &Error{File: name, Line: pe.Position.Line, Msg: msg}
	}
	return &Error{File: name, Msg: strings.TrimPrefix(err.Error(), "toml: ")}
}

// arrayKey is the dotted key the decoder names for a value at line of src,
// with the element of each array of tables it is in ("ratelimit.limit"
// in the second [[ratelimit]] is "ratelimit[2].limit"), as name shows a
// path. The headers are found by their text: src is only read up to line.
func arrayKey(src string, line int, key string) string {
	segs := strings.Split(key, ".")
	lines := strings.Split(src, "\n")
	lines = lines[:min(max(line-1, 0), len(lines))]
	var b strings.Builder
	from := 0 // the element of the enclosing array starts after this line
	for i, seg := range segs {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(seg)
		header := "[[" + strings.Join(segs[:i+1], ".") + "]]"
		n, last := 0, from
		for j := from; j < len(lines) && i < len(segs)-1; j++ {
			if h, _, _ := strings.Cut(strings.ReplaceAll(strings.TrimSpace(lines[j]), " ", ""), "#"); h == header {
				n, last = n+1, j
			}
		}
		if n > 0 {
			fmt.Fprintf(&b, "[%d]", n)
			from = last
		}
	}
	return b.String()
}

// report collects the problems of one configuration, each at the line of
// its key: src is the file's text, "" for a Config built in Go.
type report struct {
	file, src string
	lines     lineIndex // built at the first problem
	errs      []*Error
}

// fail reports msg at the line of path: keys, with "#N" for element N of
// an array.
func (r *report) fail(path []string, msg string) {
	r.errs = append(r.errs, &Error{File: r.file, Line: r.line(path...), Msg: msg})
}

// line is the line of path in the file, 0 when unknown.
func (r *report) line(path ...string) int {
	if r.lines == nil {
		r.lines = indexLines(r.src)
	}
	return r.lines.line(path...)
}

// first returns the problem with the lowest line (line 0 counts as last),
// or nil. Among equal lines the earliest found wins.
func (r *report) first() error {
	if len(r.errs) == 0 {
		return nil
	}
	best := r.errs[0]
	for _, e := range r.errs[1:] {
		if e.Line > 0 && (best.Line == 0 || e.Line < best.Line) {
			best = e
		}
	}
	return best
}

// shape checks the decoded value v at path against t, the type it will be
// decoded into (see Parse): keys t has no field for, values of the wrong
// kind, and values their type's parser refuses.
func (r *report) shape(path []string, v any, t reflect.Type) {
	bad := func(want string) { r.fail(path, fmt.Sprintf("%s: want %s, got %s", name(path), want, typeName(v))) }
	switch u := reflect.New(t).Interface().(type) {
	case *time.Duration:
		if n, ok := v.(int64); ok && inSeconds(path) {
			if n <= 0 {
				r.fail(path, fmt.Sprintf("%s: %d seconds: want a positive whole number of seconds (or a duration string such as \"5m\")", name(path), n))
			} else if n > maxWholeSeconds {
				r.fail(path, fmt.Sprintf("%s: %d seconds: want at most %d seconds (%v)", name(path), n, maxWholeSeconds, time.Duration(maxWholeSeconds)*time.Second))
			}
			return
		}
		if s, ok := v.(string); !ok {
			want := `a duration string such as "30s", "5m" or "1h30m"`
			if inSeconds(path) {
				want = `a whole number of seconds (300) or a duration string such as "30s", "5m" or "1h30m"`
			}
			bad(want)
		} else if d, err := time.ParseDuration(s); err != nil {
			r.fail(path, fmt.Sprintf(`%s: invalid duration %q: want Go syntax such as "30s", "5m" or "1h30m"`, name(path), s))
		} else if d == 0 && len(path) >= 3 && path[len(path)-3] == "override" {
			// An override's window of 0 would be taken for "the rule's".
			r.fail(path, fmt.Sprintf("%s: %q: want a positive duration (or leave it out for the rule's window)", name(path), s))
		}
		return
	case toml.Unmarshaler:
		if err := u.UnmarshalTOML(v); err != nil {
			var e *elemError
			if errors.As(err, &e) {
				r.fail(path, fmt.Sprintf("%s[%d]: %s", name(path), e.i+1, e.msg))
			} else {
				r.fail(path, name(path)+": "+detail(err))
			}
		}
		return
	case encoding.TextUnmarshaler:
		s, ok := v.(string)
		isSize := t == reflect.TypeFor[Size]() || t == reflect.TypeFor[SizeLimit]()
		if n, isInt := v.(int64); isInt && isSize {
			s, ok = strconv.FormatInt(n, 10), true
		}
		if !ok && isSize {
			bad(`a size (bytes, or a string such as "64KiB" or "1MB")`)
		} else if !ok {
			bad("a string")
		} else if err := u.UnmarshalText([]byte(s)); err != nil {
			r.fail(path, name(path)+": "+detail(err))
		}
		return
	}
	sub := func(k string) []string { return append(path[:len(path):len(path)], k) }
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			bad("a table")
			return
		}
		keys := tomlKeys(t)
		for _, k := range slices.Sorted(maps.Keys(m)) { // the same message for two problems on a line
			if i := slices.Index(keys, k); i >= 0 && k != "" {
				r.shape(sub(k), m[k], t.Field(i).Type)
			} else {
				r.unknown(sub(k), m[k], keys)
			}
		}
	case reflect.Slice:
		a := reflect.ValueOf(v)
		if a.Kind() != reflect.Slice {
			if t.Elem().Kind() == reflect.Struct {
				// The header as a file writes it: no element's index.
				header := slices.DeleteFunc(slices.Clone(path), func(p string) bool { return strings.HasPrefix(p, "#") })
				bad(fmt.Sprintf("an array of tables ([[%s]])", name(header)))
			} else {
				bad("an array of strings")
			}
			return
		}
		for i := range a.Len() {
			r.shape(sub(elem(i)), a.Index(i).Interface(), t.Elem())
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			bad("a string")
		}
	case reflect.Int, reflect.Int64:
		if _, ok := v.(int64); !ok {
			bad("an integer")
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			bad("true or false")
		}
	case reflect.Float64:
		switch v.(type) {
		case float64, int64:
		default:
			bad("a number")
		}
	default:
		panic("config: no file form for " + t.String())
	}
}

// tomlKeys returns the key of each field of struct type t, in order; ""
// for a field that is no key (toml:"-": what Load reads from the files
// the keys name).
func tomlKeys(t reflect.Type) []string {
	keys := make([]string, t.NumField())
	for i := range keys {
		keys[i], _, _ = strings.Cut(t.Field(i).Tag.Get("toml"), ",")
		if keys[i] == "-" {
			keys[i] = ""
		}
	}
	return keys
}

func (r *report) unknown(path []string, v any, known []string) {
	k := path[len(path)-1]
	if len(path) == 1 {
		what := "key"
		if _, ok := v.(map[string]any); ok {
			what = "table"
		}
		r.fail(path, fmt.Sprintf("unknown %s %q%s", what, k, suggest(k, known)))
		return
	}
	r.fail(path, fmt.Sprintf("unknown key %q in %s%s", k, name(path[:len(path)-1]), suggest(k, known)))
}

// name is how a path is shown in a message: "server.listen",
// "ratelimit[2].limit" (elements count from 1, as people do).
func name(path []string) string {
	var b strings.Builder
	for i, p := range path {
		if strings.HasPrefix(p, "#") {
			n, _ := strconv.Atoi(p[1:])
			fmt.Fprintf(&b, "[%d]", n+1)
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(toml.Key{p}.String())
	}
	return b.String()
}

// detail is the message of an error from the package that owns a value,
// without the package name it starts with: the message config writes
// starts with its own.
func detail(err error) string {
	s := err.Error()
	if pkg, msg, ok := strings.Cut(s, ": "); ok && !strings.ContainsAny(pkg, ` "`) {
		return msg
	}
	return s
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
	default:
		return "date-time"
	}
}

// suggest returns ` (did you mean "x"?)` for a known key close to k.
func suggest(k string, known []string) string {
	best, bestDist := "", 3
	for _, c := range known {
		if c == "" {
			continue
		}
		if d := editDistance(strings.ToLower(k), c); d < bestDist {
			best, bestDist = c, d
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
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
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
