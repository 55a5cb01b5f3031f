package config

import (
	"io"
	"os"
	"reflect"
	"testing"
)

// FuzzParse: arbitrary input never panics; what Parse accepts, Validate
// accepts too, is already in its WithDefaults form, and can be written out;
// what Parse refuses is an *Error.
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
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz.toml")
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("Parse error %v is a %T, not *Error", err, err)
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
	})
}
