package config

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"reflect"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/route"
)

// FuzzParse: arbitrary input never panics; what Parse accepts, Validate
// accepts too, is already in its WithDefaults form, can be written out, and
// every rule of it compiles in the packages that apply it (a check passed
// is a worker that runs); what Parse refuses is an *Error, with a line
// unless the TOML decoder gives none. In any text the decoder accepts,
// every key it reports has a line.
func FuzzParse(f *testing.F) {
	if src, err := os.ReadFile("../examples/preforkd.toml"); err == nil {
		f.Add(src)
	}
	for _, s := range []string{
		"",
		rule,
		rule + "[[ratelimit]]\nname = \"r\"\npath = \"/b\"\nlimit = 1\nwindow = \"1s\"\n",
		"[server]\nlisten = \":1\"\nlisen = 2\n",
		"[server]\ntrusted_proxies = [\"10.0.0.0/8\", \"::1\"]\nmax_request_body = \"1MiB\"\n",
		"[table]\ncounters = 1000\nresponse_bytes = \"10KB\"\n",
		"[[idempotency]]\npath = \"/orders\"\nmethods = [\"post\"]\nby = \"header:X|ip\"\n",
		"ratelimit = [{name = \"a\", path = \"/a/*\", limit = 1, window = \"1ms\", burst = 2}]\n",
		"a.b = \"\"\"\nx\n\"\"\"\n[x]\n[[y]]\n",
		"[persist]\nkey = '''\n'''\n",
		"[[ratelimit]]\nname = \"w\"\npath = \"/w\"\nlimit = 3\nwindow = \"4886h43m6.044415s\"\nburst = 2\nalgorithm = \"gcra\"\non_full = \"closed\"\nmode = \"shadow\"\n",
		"[server]\nheaders = \"x\"\nshutdown_timeout = \"1h\"\n[[idempotency]]\npath = \"/o/*\"\nmax_body = \"2KiB\"\nwait = \"0s\"\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		md, tomlErr := toml.Decode(string(data), new(map[string]any))
		if tomlErr == nil {
			ix := indexLines(string(data))
			for _, k := range md.Keys() {
				if ix.line(k...) == 0 {
					t.Fatalf("key %q has no line in\n%q", k, data)
				}
			}
		}
		c, err := Parse(data, "fuzz.toml")
		if err != nil {
			if e, ok := err.(*Error); !ok || e.Line == 0 && tomlErr == nil {
				t.Fatalf("Parse error %v is a %T, not an *Error with a line\n%q", err, err, data)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted what Validate refuses: %v\n%q", err, data)
		}
		if d := c.WithDefaults(); !reflect.DeepEqual(c, d) {
			t.Fatalf("Parse result changes under WithDefaults:\n%+v\n%+v", c, d)
		}
		if err := c.WriteEffective(io.Discard); err != nil {
			t.Fatal(err)
		}
		// The workers get it as JSON (the supervisor's settings'
		// payload): whole.
		payload, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("the configuration does not encode for the workers: %v\n%q", err, data)
		}
		var got Config
		if err := json.Unmarshal(payload, &got); err != nil {
			t.Fatalf("a worker cannot decode the configuration (%v): %s\nfrom %q", err, payload, data)
		}
		// What the file wrote of tls.cleartext and tls.redirect_port
		// (unexported) is for the supervisor's Warnings, of the file it
		// read: no worker warns, and JSON leaves it out.
		want := c
		want.TLS.cleartextSet, want.TLS.redirectPortSet = false, false
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("a worker decodes\n%+v\nof\n%+v\nfrom %q", got, want, data)
		}
		for _, r := range c.RateLimits {
			_, err1 := r.BucketRule().Compile()
			_, err2 := route.Compile(r.Path, r.Methods)
			_, err3 := clientip.ParseBy(r.By)
			if err := errors.Join(err1, err2, err3); err != nil {
				t.Fatalf("Parse accepted a rule that does not compile: %v\n%q", err, data)
			}
		}
		for _, d := range c.Idempotency {
			_, err1 := route.Compile(d.Path, d.Methods)
			_, err2 := clientip.ParseBy(d.By)
			if err := errors.Join(err1, err2); err != nil {
				t.Fatalf("Parse accepted a block that does not compile: %v\n%q", err, data)
			}
		}
	})
}
