package core

import (
	"strings"
	"testing"
)

// A problem's strings are escaped for JSON, and what is not printable
// ASCII becomes '?', so that a client's JSON parser never meets a broken
// UTF-8 sequence; the members come in their fixed order.
func TestProblemJSONEscapes(t *testing.T) {
	p := Problem{
		Status:    429,
		Title:     "quote \" backslash \\",
		Detail:    "tab\tdel\x7flatin\xe9 é",
		RequestID: []byte("id\x01\xff"),
		Extra:     []byte(`,"x":1`),
	}
	const want = `{"type":"about:blank","title":"quote \" backslash \\","status":429,` +
		`"detail":"tab\u0009del?latin? ??","request_id":"id\u0001?","x":1}` + "\n"
	if got := string(p.AppendJSON(nil)); got != want {
		t.Errorf("AppendJSON:\n got %s\nwant %s", got, want)
	}
	p.DetailText = []byte("text\n\"é\"")
	const wantText = `"detail":"text\u000a\"??\""`
	if got := string(p.AppendJSON(nil)); !strings.Contains(got, wantText) {
		t.Errorf("AppendJSON with DetailText: %s lacks %s", got, wantText)
	}
}
