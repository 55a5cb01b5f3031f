package accesslog_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/accesslog"
)

// README's sample lines, its log.access_format row and the example file
// name the fields a line has, in their order: the next field added is
// documented or this fails.
func TestFieldsDocumented(t *testing.T) {
	line := func(f accesslog.Format) string {
		l, path := memLog(t, f)
		l.Log(entry())
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return read(t, path)
	}
	pair := regexp.MustCompile(`(?:^| )([a-z_]+)=`)
	combinedKeys := func(s string) []string {
		var k []string
		for _, m := range pair.FindAllStringSubmatch(s, -1) {
			k = append(k, m[1])
		}
		return k
	}
	jsonKeys := func(s string) []string {
		d := json.NewDecoder(strings.NewReader(s))
		var k []string
		if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
			t.Fatalf("not a JSON object: %s", s)
		}
		for d.More() {
			tok, err := d.Token()
			if err != nil {
				t.Fatal(err)
			}
			k = append(k, tok.(string))
			var v any
			if err := d.Decode(&v); err != nil {
				t.Fatal(err)
			}
		}
		return k
	}
	// The combined line's own fields: past nginx's nine.
	_, own, _ := strings.Cut(line(accesslog.Combined), `"curl/8.5.0" `)
	combined, fields := combinedKeys(own), jsonKeys(line(accesslog.JSON))

	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../examples/preforkd.toml")
	if err != nil {
		t.Fatal(err)
	}
	var sawCombined, sawJSON bool
	for l := range strings.SplitSeq(string(readme), "\n") {
		switch {
		case strings.HasPrefix(l, "192.0.2.7 - - ["):
			sawCombined = true
			_, own, _ := strings.Cut(l, `"curl/8.5.0" `)
			if got := combinedKeys(own); !slices.Equal(got, combined) {
				t.Errorf("README's combined line has %q, a line has %q", got, combined)
			}
		case strings.HasPrefix(l, `{"time":`):
			sawJSON = true
			if got := jsonKeys(l); !slices.Equal(got, fields) {
				t.Errorf("README's JSON line has %q, a line has %q", got, fields)
			}
		case strings.HasPrefix(l, "| `log.access_format` |"):
			var got []string
			for _, m := range regexp.MustCompile("`([a-z_]+)=`").FindAllStringSubmatch(l, -1) {
				got = append(got, m[1])
			}
			if !slices.Equal(got, combined) {
				t.Errorf("README's log.access_format row names %q, a combined line has %q", got, combined)
			}
		}
	}
	if !sawCombined || !sawJSON {
		t.Errorf("README has no sample line of each format (combined %v, JSON %v)", sawCombined, sawJSON)
	}

	// The example's comment on access_format: "request_id= ... scheme="
	// and the JSON fields "(time, client, ...)".
	i := strings.Index(string(example), "\naccess_format =")
	if i < 0 {
		t.Fatal("the example has no access_format")
	}
	j := strings.LastIndex(string(example[:i]), "\n\n")
	comment := strings.ReplaceAll(string(example[j:i]), "\n# ", " ")
	if got := combinedKeys(comment); !slices.Equal(got, combined) {
		t.Errorf("the example's access_format names %q, a combined line has %q", got, combined)
	}
	m := regexp.MustCompile(`\((time, [a-z_, ]+)\)`).FindStringSubmatch(comment)
	if m == nil || !slices.Equal(strings.Split(m[1], ", "), fields) {
		t.Errorf("the example's access_format lists the JSON fields %v, a line has %q", m, fields)
	}
}
