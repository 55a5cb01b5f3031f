package config

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Load reads the file at path and parses it with [Parse]. A file that cannot
// be read gives an error that wraps the one from the file system (so
// errors.Is(err, fs.ErrNotExist) works); a bad file gives an *Error.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path)
}

// Parse parses a TOML configuration, fills in the defaults and validates the
// result. name is the file name used in errors. Every problem is an *Error
// carrying the line of the offending key; when there are several, the one
// that comes first in the file is reported.
func Parse(data []byte, name string) (Config, error) {
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return Config{}, &Error{File: name, Line: pe.Position.Line, Msg: pe.Message}
		}
		return Config{}, &Error{File: name, Msg: strings.TrimPrefix(err.Error(), "toml: ")}
	}
	d := decoder{file: name, lines: indexLines(string(data))}
	c := d.config(raw)
	if err := first(d.errs); err != nil {
		return Config{}, err
	}
	if err := c.check(name, func(section string, i int, key string) int {
		if i < 0 {
			return d.lines.line(section, key)
		}
		return d.lines.line(section, elem(i), key)
	}); err != nil {
		return Config{}, err
	}
	return c.WithDefaults(), nil
}

// first returns the error with the lowest line (line 0 counts as last), or
// nil. Among equal lines the earliest found wins.
func first(errs []*Error) error {
	if len(errs) == 0 {
		return nil
	}
	best := errs[0]
	for _, e := range errs[1:] {
		if e.Line > 0 && (best.Line == 0 || e.Line < best.Line) {
			best = e
		}
	}
	return best
}

// decoder turns the decoded TOML tree into a Config. It checks names and
// types and converts durations, sizes and addresses; everything else is for
// [Config.check]. Problems are collected, not returned at once, so that the
// first one in the file can be reported whatever order the tree is walked in.
type decoder struct {
	file  string
	lines lineIndex
	errs  []*Error
}

func (d *decoder) fail(path []string, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Line: d.lines.line(path...), Msg: fmt.Sprintf(format, args...)})
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

// keysInOrder returns the keys of m in the order of the file.
func (d *decoder) keysInOrder(path []string, m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	at := func(k string) int { return d.lines.line(append(path[:len(path):len(path)], k)...) }
	sort.Slice(keys, func(i, j int) bool {
		li, lj := at(keys[i]), at(keys[j])
		if li != lj {
			return li < lj
		}
		return keys[i] < keys[j]
	})
	return keys
}

// table calls field for each key of the table at path, and reports keys
// that field does not know (field returns false).
func (d *decoder) table(path []string, v any, known []string, field func(key string, path []string, v any) bool) {
	m, ok := v.(map[string]any)
	if !ok {
		d.fail(path, "%s: want a table, got %s", name(path), typeName(v))
		return
	}
	for _, k := range d.keysInOrder(path, m) {
		p := append(path[:len(path):len(path)], k)
		if !field(k, p, m[k]) {
			d.unknown(p, m[k], known)
		}
	}
}

func (d *decoder) unknown(path []string, v any, known []string) {
	k := path[len(path)-1]
	if len(path) == 1 {
		what := "key"
		if _, ok := v.(map[string]any); ok {
			what = "table"
		}
		d.fail(path, "unknown %s %q%s", what, k, suggest(k, known))
		return
	}
	d.fail(path, "unknown key %q in %s%s", k, name(path[:len(path)-1]), suggest(k, known))
}

var (
	topKeys         = []string{"server", "admin", "table", "persist", "ratelimit", "idempotency"}
	serverKeys      = []string{"listen", "workers", "upstream", "trusted_proxies", "ipv6_prefix", "shutdown_timeout", "headers", "max_request_body"}
	adminKeys       = []string{"listen", "token_file"}
	tableKeys       = []string{"counters", "responses", "response_bytes"}
	persistKeys     = []string{"path", "key", "live"}
	rateLimitKeys   = []string{"name", "path", "methods", "limit", "window", "algorithm", "burst", "by", "mode", "on_full"}
	idempotencyKeys = []string{"path", "methods", "header", "required", "ttl", "wait", "by", "max_body"}
)

func (d *decoder) config(raw map[string]any) Config {
	c := Default()
	d.table(nil, raw, topKeys, func(k string, p []string, v any) bool {
		switch k {
		case "server":
			d.server(p, v, &c.Server)
		case "admin":
			d.table(p, v, adminKeys, func(k string, p []string, v any) bool {
				switch k {
				case "listen":
					d.str(p, v, &c.Admin.Listen)
				case "token_file":
					d.str(p, v, &c.Admin.TokenFile)
				default:
					return false
				}
				return true
			})
		case "table":
			d.table(p, v, tableKeys, func(k string, p []string, v any) bool {
				switch k {
				case "counters":
					d.intRange(p, v, &c.Table.Counters)
				case "responses":
					d.intRange(p, v, &c.Table.Responses)
				case "response_bytes":
					d.size(p, v, &c.Table.ResponseBytes)
				default:
					return false
				}
				return true
			})
		case "persist":
			d.table(p, v, persistKeys, func(k string, p []string, v any) bool {
				switch k {
				case "path":
					d.str(p, v, &c.Persist.Path)
				case "key":
					d.str(p, v, &c.Persist.Key)
				case "live":
					d.str(p, v, &c.Persist.Live)
				default:
					return false
				}
				return true
			})
		case "ratelimit":
			for i, e := range d.tables(p, v) {
				c.RateLimits = append(c.RateLimits, d.rateLimit(append(p, elem(i)), e))
			}
		case "idempotency":
			for i, e := range d.tables(p, v) {
				c.Idempotency = append(c.Idempotency, d.idempotency(append(p, elem(i)), e))
			}
		default:
			return false
		}
		return true
	})
	return c
}

func (d *decoder) server(path []string, v any, s *Server) {
	d.table(path, v, serverKeys, func(k string, p []string, v any) bool {
		switch k {
		case "listen":
			d.str(p, v, &s.Listen)
		case "workers":
			d.intRange(p, v, &s.Workers)
		case "upstream":
			d.str(p, v, &s.Upstream)
		case "trusted_proxies":
			s.TrustedProxies = d.prefixes(p, v)
		case "ipv6_prefix":
			d.intRange(p, v, &s.IPv6Prefix)
		case "shutdown_timeout":
			d.duration(p, v, &s.ShutdownTimeout)
		case "headers":
			d.str(p, v, &s.Headers)
		case "max_request_body":
			d.size(p, v, &s.MaxRequestBody)
		default:
			return false
		}
		return true
	})
}

// tables returns the elements of an array of tables ([[x]] or x = [{...}]).
func (d *decoder) tables(path []string, v any) []any {
	switch v := v.(type) {
	case []map[string]any:
		out := make([]any, len(v))
		for i := range v {
			out[i] = v[i]
		}
		return out
	case []any:
		return v
	}
	d.fail(path, "%s: want an array of tables ([[%s]]), got %s", name(path), name(path), typeName(v))
	return nil
}

func (d *decoder) rateLimit(path []string, v any) RateLimit {
	r := defaultRateLimit()
	r.Line = d.lines.line(path...)
	d.table(path, v, rateLimitKeys, func(k string, p []string, v any) bool {
		switch k {
		case "name":
			d.str(p, v, &r.Name)
		case "path":
			d.str(p, v, &r.Path)
		case "methods":
			r.Methods = d.methods(p, v)
		case "limit":
			d.int64(p, v, &r.Limit)
		case "window":
			d.duration(p, v, &r.Window)
		case "algorithm":
			d.str(p, v, &r.Algorithm)
		case "burst":
			d.int64(p, v, &r.Burst)
		case "by":
			d.str(p, v, &r.By)
		case "mode":
			d.str(p, v, &r.Mode)
		case "on_full":
			d.str(p, v, &r.OnFull)
		default:
			return false
		}
		return true
	})
	return r
}

func (d *decoder) idempotency(path []string, v any) Idempotency {
	r := defaultIdempotency()
	r.Line = d.lines.line(path...)
	d.table(path, v, idempotencyKeys, func(k string, p []string, v any) bool {
		switch k {
		case "path":
			d.str(p, v, &r.Path)
		case "methods":
			r.Methods = d.methods(p, v)
		case "header":
			d.str(p, v, &r.Header)
		case "required":
			if b, ok := v.(bool); ok {
				r.Required = b
			} else {
				d.fail(p, "%s: want true or false, got %s", name(p), typeName(v))
			}
		case "ttl":
			d.duration(p, v, &r.TTL)
		case "wait":
			d.duration(p, v, &r.Wait)
		case "by":
			d.str(p, v, &r.By)
		case "max_body":
			d.size(p, v, &r.MaxBody)
		default:
			return false
		}
		return true
	})
	return r
}
