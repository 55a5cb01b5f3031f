package tlsedge

import (
	"bytes"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// guardOn is a guard that only looks: no connection under it.
func guardOn() *h2Guard { return newH2Guard(nil, 64<<10, 0, nil) }

// frames writes what write writes with a framer, after the preface.
func frames(t testing.TB, write func(fr *http2.Framer)) []byte {
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	write(http2.NewFramer(&b, nil))
	return b.Bytes()
}

// The guard follows frames however the reads cut them: byte by byte it
// decides as on the whole, and it decodes padded and prioritized HEADERS
// and CONTINUATION as one header block.
func TestH2GuardFollowsFrames(t *testing.T) {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":path", Value: "/x"}, {Name: "x-long", Value: strings.Repeat("v", 300)}} {
		enc.WriteField(f)
	}
	block := hb.Bytes()
	in := frames(t, func(fr *http2.Framer) {
		fr.WriteSettings()
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:10], EndStream: true, PadLength: 7,
			Priority: http2.PriorityParam{StreamDep: 0, Weight: 9}})
		fr.WriteContinuation(1, false, block[10:20])
		fr.WriteContinuation(1, true, block[20:])
		fr.WriteData(3, true, []byte("data that is no header block"))
	})
	whole := guardOn()
	if err := whole.look(in); err != nil {
		t.Fatal(err)
	}
	want := uint32(0)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":path", Value: "/x"}, {Name: "x-long", Value: strings.Repeat("v", 300)}} {
		want += f.Size()
	}
	if whole.decoded != want || whole.streams != 1 || whole.block {
		t.Fatalf("decoded %d (want %d), streams %d, in a block %v", whole.decoded, want, whole.streams, whole.block)
	}
	bytewise := guardOn()
	for i := range in {
		if err := bytewise.look(in[i : i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if bytewise.decoded != whole.decoded || bytewise.streams != whole.streams {
		t.Errorf("byte by byte: decoded %d, streams %d", bytewise.decoded, bytewise.streams)
	}
}

// Each flood is told apart from what a browser does.
func TestH2GuardFloods(t *testing.T) {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	enc.WriteField(hpack.HeaderField{Name: ":path", Value: "/"})
	small := append([]byte(nil), hb.Bytes()...)
	for _, tc := range []struct {
		name  string
		write func(fr *http2.Framer)
		kind  int // -1: not a flood
	}{
		{"a browser cancelling some streams", func(fr *http2.Framer) {
			for i := range 300 {
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: small, EndHeaders: true})
				if i%3 == 0 {
					fr.WriteRSTStream(uint32(2*i+1), http2.ErrCodeCancel)
				}
			}
		}, -1},
		{"rapid reset", func(fr *http2.Framer) {
			for i := range 300 {
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: small, EndHeaders: true})
				fr.WriteRSTStream(uint32(2*i+1), http2.ErrCodeCancel)
			}
		}, floodReset},
		{"CONTINUATION", func(fr *http2.Framer) {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: small})
			for range 100 {
				fr.WriteContinuation(1, false, nil)
			}
		}, floodContinuation},
		{"HPACK bomb", func(fr *http2.Framer) {
			var b bytes.Buffer
			e := hpack.NewEncoder(&b)
			for range 100 {
				e.WriteField(hpack.HeaderField{Name: "x", Value: strings.Repeat("b", 4000)})
			}
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b.Bytes(), EndHeaders: true})
		}, floodHPACK},
	} {
		err := guardOn().look(frames(t, tc.write))
		switch {
		case tc.kind < 0 && err != nil:
			t.Errorf("%s: cut off (%v)", tc.name, err)
		case tc.kind >= 0 && (err == nil || err.kind != tc.kind):
			t.Errorf("%s: %v, want a flood of kind %d", tc.name, err, tc.kind)
		}
	}
}

// Whatever a client sends, the guard neither panics nor loops, and it
// decides the same however the reads cut what it sends.
func FuzzH2Guard(f *testing.F) {
	f.Add(frames(f, func(fr *http2.Framer) {
		fr.WriteSettings()
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82, 0x84}, EndHeaders: true, PadLength: 3})
	}), 7)
	f.Fuzz(func(t *testing.T, in []byte, cut int) {
		whole := guardOn()
		werr := whole.look(in)
		g := guardOn()
		var err *errFlood
		for rest := in; len(rest) > 0 && err == nil; {
			n := min(max(cut%64, 1), len(rest))
			err = g.look(rest[:n])
			rest = rest[n:]
		}
		switch {
		case (werr == nil) != (err == nil), werr != nil && werr.kind != err.kind:
			t.Fatalf("whole: %v; in pieces of %d: %v", werr, max(cut%64, 1), err)
		case werr == nil && (g.streams != whole.streams || g.resets != whole.resets || g.decoded != whole.decoded ||
			g.block != whole.block || g.frames != whole.frames || g.raw != whole.raw):
			t.Fatalf("whole: streams %d resets %d decoded %d; in pieces of %d: streams %d resets %d decoded %d",
				whole.streams, whole.resets, whole.decoded, max(cut%64, 1), g.streams, g.resets, g.decoded)
		}
	})
}

// The server's resets are followed however its writes cut them; only
// those whose code blames the client count.
func TestH2GuardFollowsServerResets(t *testing.T) {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	fr.WriteSettings()
	fr.WriteRSTStream(1, http2.ErrCodeProtocol)
	fr.WriteData(3, true, []byte("abcd"))       // a payload of 4 bytes, as a reset's
	fr.WriteRSTStream(5, http2.ErrCodeNo)       // an early answer
	fr.WriteRSTStream(9, http2.ErrCodeInternal) // an upstream's response cut short
	fr.WriteRSTStream(7, http2.ErrCodeFlowControl)
	in := b.Bytes()
	var whole, bytewise outFrames
	if n := whole.follow(in); n != 2 {
		t.Errorf("whole: %d resets, want 2", n)
	}
	n := 0
	for i := range in {
		n += bytewise.follow(in[i : i+1])
	}
	if n != 2 {
		t.Errorf("byte by byte: %d resets, want 2", n)
	}
}
