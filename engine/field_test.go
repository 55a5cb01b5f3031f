package engine_test

import (
	"testing"

	"github.com/preforkd/preforkd/engine"
)

func TestParseFieldLine(t *testing.T) {
	for _, tc := range []struct {
		line        string
		fault       engine.FieldFault
		name, value string
	}{
		{line: "Host: a", name: "Host", value: "a"},
		{line: "X-A:\t b c \t", name: "X-A", value: "b c"},
		{line: "X-Empty:", name: "X-Empty", value: ""},
		{line: "X-Spaces:   ", name: "X-Spaces", value: ""},
		{line: "X-Colon: a:b", name: "X-Colon", value: "a:b"},
		{line: " folded", fault: engine.FaultObsFold},
		{line: "\tfolded: x", fault: engine.FaultObsFold},
		{line: "no colon", fault: engine.FaultNoColon},
		{line: "", fault: engine.FaultNoColon},
		{line: ": no name", fault: engine.FaultName},
		{line: "X A: space in the name", fault: engine.FaultName},
		{line: "X-A : space before the colon", fault: engine.FaultName},
		{line: "X-A: b\x00c", fault: engine.FaultValueCtrl},
		{line: "X-A: b\rc", fault: engine.FaultValueCtrl},
		{line: "X-A: b\x7f", fault: engine.FaultValueCtrl},
		{line: "X-A: b\tc", name: "X-A", value: "b\tc"},
		{line: "X-A: caf\xc3\xa9", name: "X-A", value: "caf\xc3\xa9"}, // obs-text is no control character
	} {
		fl, fault := engine.ParseFieldLine([]byte(tc.line))
		if fault != tc.fault {
			t.Errorf("%q: fault %d, want %d", tc.line, fault, tc.fault)
			continue
		}
		if bad := fault.BadRequest(); (bad == nil) != (fault == engine.FieldOK) || bad != nil && (bad.Status != 400 || !bad.CloseConn) {
			t.Errorf("%q: refused with %+v", tc.line, bad)
		}
		if fault != engine.FieldOK {
			continue
		}
		if name, value := tc.line[:fl.NameEnd], tc.line[fl.ValueFrom:fl.ValueTo]; name != tc.name || value != tc.value {
			t.Errorf("%q: name %q value %q, want %q %q", tc.line, name, value, tc.name, tc.value)
		}
	}
}

func TestClassifyField(t *testing.T) {
	for name, want := range map[string]engine.FieldKind{
		"Host": engine.FieldHost, "HOST": engine.FieldHost,
		"TE": engine.FieldHopByHop, "Trailer": engine.FieldHopByHop, "Keep-Alive": engine.FieldHopByHop,
		"Proxy-Connection": engine.FieldHopByHop, "proxy-authorization": engine.FieldHopByHop,
		"Connection": engine.FieldConnection, "Upgrade": engine.FieldUpgrade,
		"Content-Length": engine.FieldLength, "Transfer-Encoding": engine.FieldEncoding,
		"Expect": engine.FieldExpect, "x-forwarded-for": engine.FieldForwardedFor,
		"X-Forwarded-Host": engine.FieldForwardedOther, "X-Forwarded-Proto": engine.FieldForwardedOther,
		"Proxy-": engine.FieldOther, "Content-Type": engine.FieldOther, "Hosts": engine.FieldOther,
		"X_Forwarded_For": engine.FieldOther,
	} {
		if got := engine.ClassifyField([]byte(name)); got != want {
			t.Errorf("ClassifyField(%q) = %d, want %d", name, got, want)
		}
	}
	for name, want := range map[string]engine.FieldKind{
		"X_Forwarded_For": engine.FieldDropped, "X-A_B": engine.FieldDropped,
		"X-A": engine.FieldOther, "Host": engine.FieldHost, "Proxy-A_B": engine.FieldHopByHop,
	} {
		if got := engine.ClassifyRequestField([]byte(name)); got != want {
			t.Errorf("ClassifyRequestField(%q) = %d, want %d", name, got, want)
		}
	}
}

// The fields the upstream gets as sent (RequestFieldSeen), and the ones a
// client gets of a response (ResponseFieldPassed), kind by kind.
func TestFieldFate(t *testing.T) {
	kinds := []engine.FieldKind{engine.FieldOther, engine.FieldHost, engine.FieldHopByHop, engine.FieldConnection,
		engine.FieldUpgrade, engine.FieldLength, engine.FieldEncoding, engine.FieldExpect, engine.FieldForwardedFor,
		engine.FieldForwardedOther, engine.FieldDropped}
	seen := func(ownHost, upgrade bool) (s string) {
		for _, k := range kinds {
			if engine.RequestFieldSeen(k, ownHost, upgrade) {
				s += "1"
			} else {
				s += "0"
			}
		}
		return s
	}
	passed := func(switched bool) (s string) {
		for _, k := range kinds {
			if engine.ResponseFieldPassed(k, switched) {
				s += "1"
			} else {
				s += "0"
			}
		}
		return s
	}
	for _, tc := range []struct{ got, want string }{
		// Other Host HopByHop Connection Upgrade Length Encoding Expect XFF XFOther Dropped
		{seen(false, false), "11000100100"},
		{seen(true, false), "10000100100"},
		{seen(false, true), "11001100100"},
		{passed(false), "11000001110"},
		{passed(true), "11001001110"}, // the server sends its own Connection with a 101
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}

func TestForwardedField(t *testing.T) {
	for _, tc := range []struct {
		name, host, want string
		ok               bool
	}{
		{"Host", "a.example", "a.example", true},
		{"x-forwarded-host", "a.example", "a.example", true},
		{"X-Forwarded-Proto", "", "http", true},
		{"Host", "", "", false},
		{"X-Forwarded-Host", "", "", false},
		{"X-Forwarded-For", "a.example", "", false},
		{"Hos", "a.example", "", false},
	} {
		v, ok := engine.ForwardedField([]byte(tc.name), []byte(tc.host))
		if string(v) != tc.want || ok != tc.ok {
			t.Errorf("ForwardedField(%q, %q) = %q, %v; want %q, %v", tc.name, tc.host, v, ok, tc.want, tc.ok)
		}
	}
}

func TestEachToken(t *testing.T) {
	var got []string
	engine.EachToken([]byte(" close ,, Upgrade\t,x-a,"), func(t []byte) { got = append(got, string(t)) })
	if len(got) != 3 || got[0] != "close" || got[1] != "Upgrade" || got[2] != "x-a" {
		t.Errorf("tokens %q", got)
	}
}

func TestEqualFold(t *testing.T) {
	for _, tc := range []struct {
		b, s string
		want bool
	}{
		{"Keep-Alive", "keep-alive", true},
		{"KEEP-ALIVE", "keep-alive", true},
		{"keep-alivf", "keep-alive", false},
		{"keep-alive ", "keep-alive", false},
		{"[", "{", false},      // 0x5b is not 0x7b's upper case
		{"\u212a", "k", false}, // the Kelvin sign folds to k in Unicode, not in ASCII
	} {
		if got := engine.EqualFold([]byte(tc.b), tc.s); got != tc.want {
			t.Errorf("EqualFold(%q, %q) = %v", tc.b, tc.s, got)
		}
	}
}

func TestFieldLineAllocs(t *testing.T) {
	line := []byte("X-Forwarded-For: 192.0.2.1, 198.51.100.2")
	if n := testing.AllocsPerRun(100, func() {
		fl, _ := engine.ParseFieldLine(line)
		_ = engine.ClassifyRequestField(line[:fl.NameEnd])
		engine.EachToken(line[fl.ValueFrom:fl.ValueTo], func([]byte) {})
	}); n != 0 {
		t.Errorf("%v allocations a line", n)
	}
}

func TestSwitchAsked(t *testing.T) {
	for _, tc := range []struct {
		asked, switched string
		want            bool
	}{
		{"websocket", "websocket", true},
		{"WebSocket", "websocket", true},
		{",websocket, echo", ",echo", true},
		{"websocket", "echo", false},
		{"websocket", "websocket, h2c", false},
		{"websocket", "websocke", false},
		{"", "websocket", false},
		{"websocket", "", true}, // no Upgrade: ParseResponseHead's to refuse
	} {
		if got := engine.SwitchAsked([]byte(tc.asked), []byte(tc.switched)); got != tc.want {
			t.Errorf("SwitchAsked(%q, %q) = %v, want %v", tc.asked, tc.switched, got, tc.want)
		}
	}
}

// BenchmarkParseFieldLine parses the field lines of a usual request and
// response head, as the loop does for every request it proxies.
func BenchmarkParseFieldLine(b *testing.B) {
	lines := [][]byte{
		[]byte("Host: bench.example"), []byte("User-Agent: ApacheBench/2.3"), []byte("Accept: */*"),
		[]byte("Server: nginx/1.26.3"), []byte("Date: Sat, 05 Dec 2026 02:40:25 GMT"),
		[]byte("Content-Type: text/plain"), []byte("Content-Length: 6"), []byte("Connection: keep-alive"),
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, l := range lines {
			if _, f := engine.ParseFieldLine(l); f != engine.FieldOK {
				b.Fatal(f)
			}
		}
	}
}
