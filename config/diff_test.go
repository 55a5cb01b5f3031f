package config

import (
	"reflect"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/examples"
)

func TestDiff(t *testing.T) {
	base := Config{
		Server: Server{Workers: 2, Upstream: "http://127.0.0.1:9000"},
		RateLimits: []RateLimit{
			{Name: "login", Path: "/login", Limit: 5, Window: time.Minute},
			{Name: "api", Path: "/api/*", Limit: 100, Window: time.Minute},
		},
		Idempotency: []Idempotency{{Path: "/orders", TTL: time.Hour}},
	}.WithDefaults()

	edit := func(f func(c *Config)) Config {
		c := base
		c.RateLimits = slices.Clone(base.RateLimits)
		c.Idempotency = slices.Clone(base.Idempotency)
		f(&c)
		return c.WithDefaults()
	}
	for _, tc := range []struct {
		name string
		next Config
		want Changes
	}{
		{"same", base, Changes{}},
		{"rules moved", edit(func(c *Config) {
			c.RateLimits[0], c.RateLimits[1] = c.RateLimits[1], c.RateLimits[0]
		}), Changes{}},
		{"a default spelled out", edit(func(c *Config) { c.RateLimits[0].By = "ip" }), Changes{}},
		{"server keys", edit(func(c *Config) {
			c.Server.Upstream = "http://127.0.0.1:9001"
			c.Server.IPv6Prefix = 56
			c.Server.MaxRequestBody = 2 << 20
		}), Changes{Keys: []string{"server.upstream", "server.ipv6_prefix", "server.max_request_body"}}},
		{"admin and persist", edit(func(c *Config) {
			c.Admin.TokenFile = "/etc/preforkd/token"
			c.Persist.Key = "v2"
		}), Changes{Keys: []string{"admin.token_file", "persist.key"}}},
		{"a rule changed, one added, one removed", edit(func(c *Config) {
			c.RateLimits[0].Limit = 10
			c.RateLimits[0].OnFull = bucket.Closed
			c.RateLimits[1] = RateLimit{Name: "search", Path: "/search", Limit: 1, Window: time.Second}
		}), Changes{
			Keys:       []string{"ratelimit.login.limit", "ratelimit.login.on_full"},
			RulesAdded: []string{"search"}, RulesRemoved: []string{"api"}, RulesChanged: []string{"login"},
		}},
		{"blocks", edit(func(c *Config) {
			c.Idempotency[0].TTL = 2 * time.Hour
			c.Idempotency = append(c.Idempotency, Idempotency{Path: "/pay"})
		}), Changes{Keys: []string{"idempotency./orders.ttl"}, BlocksAdded: []string{"/pay"}, BlocksChanged: []string{"/orders"}}},
		{"two blocks on one path", edit(func(c *Config) {
			c.Idempotency = append(c.Idempotency, Idempotency{Path: "/orders", Methods: []string{"PUT"}})
		}), Changes{BlocksAdded: []string{"/orders#2"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Diff(base, tc.next)
			if !reflect.DeepEqual(norm(got), norm(tc.want)) {
				t.Errorf("Diff = %+v\nwant   %+v", got, tc.want)
			}
			if got.Empty() != (len(tc.want.Keys)+len(tc.want.RulesAdded)+len(tc.want.RulesRemoved)+len(tc.want.BlocksAdded)+len(tc.want.BlocksRemoved) == 0) {
				t.Errorf("Empty() = %v for %+v", got.Empty(), got)
			}
		})
	}
}

// norm makes nil and empty lists equal.
func norm(c Changes) Changes {
	v := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		if v.Field(i).Len() == 0 {
			v.Field(i).Set(reflect.Zero(v.Field(i).Type()))
		}
	}
	return c
}

// Every name Diff can report is a key of the file, as the example
// configuration writes it: a field whose Go name does not turn into its key
// would be logged under a name no operator can find.
func TestDiffNamesAreFileKeys(t *testing.T) {
	// inline: the table is written inline (sentinel = { master = "" }),
	// its keys anywhere on a line.
	var walk func(prefix string, ty reflect.Type, inline bool)
	walk = func(prefix string, ty reflect.Type, inline bool) {
		for i := range ty.NumField() {
			f := ty.Field(i)
			name := keyName(f)
			if name == "" {
				continue
			}
			ft := f.Type
			if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
				ft = ft.Elem()
			}
			// A table is a struct of this package (a value type, such as
			// netip.Prefix, is not).
			if ft.Kind() == reflect.Struct && ft.PkgPath() == reflect.TypeFor[Config]().PkgPath() {
				table := name
				if prefix != "" {
					table = prefix + "." + name
				}
				header := regexp.MustCompile(`(?m)^(# )*\[\[?` + regexp.QuoteMeta(table) + `\]\]?`)
				inlined := regexp.MustCompile(`(?m)^(# )*` + regexp.QuoteMeta(name) + ` = \{`)
				switch {
				case header.MatchString(examples.Config):
					walk(table, ft, false)
				case inlined.MatchString(examples.Config):
					walk(table, ft, true)
				default:
					t.Errorf("field %s: no [%s] table in the example configuration", f.Name, table)
				}
				continue
			}
			key := `(?m)^(# )*` + regexp.QuoteMeta(name) + ` = `
			if inline {
				key = `\b` + regexp.QuoteMeta(name) + ` = `
			}
			if !regexp.MustCompile(key).MatchString(examples.Config) {
				t.Errorf("field %s.%s: no key %q in the example configuration", prefix, f.Name, name)
			}
		}
	}
	walk("", reflect.TypeFor[Config](), false)
}
