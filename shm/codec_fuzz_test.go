package shm

import (
	"bytes"
	"testing"
)

// FuzzResponseCodec: decoding arbitrary stored bytes never panics or reads
// past them, and what encodes decodes back to the same response.
func FuzzResponseCodec(f *testing.F) {
	f.Add(uint16(201), "application/json", "/orders/1", "", []byte(`{"id":1}`), []byte{})
	f.Add(uint16(201), "application/json", "", "gzip", []byte{0x1f, 0x8b, 8}, []byte{})
	f.Add(uint16(204), "", "", "", []byte{}, []byte{1, 2, 3, 0, 0, 0, 0, 0, 9})
	f.Add(uint16(200), "application/octet-stream", "", "", []byte{0, 0, 0xff}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, status uint16, ct, loc, ce string, body, raw []byte) {
		var got Response
		if decodeResponse(raw, &got) {
			if len(got.ContentType)+len(got.Location)+len(got.ContentEncoding)+len(got.Body)+8 != len(raw) {
				t.Fatalf("decoded %d+%d+%d+%d bytes from %d", len(got.ContentType), len(got.Location), len(got.ContentEncoding), len(got.Body), len(raw))
			}
		}
		in := Response{Status: int(status), ContentType: ct, Location: loc, ContentEncoding: ce, Body: body}
		var out Response
		if !decodeResponse(encodeResponse(&in), &out) {
			t.Fatal("an encoded response does not decode")
		}
		if len(ct) <= 0xffff && len(loc) <= 0xffff && len(ce) <= 0xffff &&
			(out.Status != in.Status || out.ContentType != ct || out.Location != loc || out.ContentEncoding != ce || !bytes.Equal(out.Body, body)) {
			t.Fatalf("round trip: %+v → %+v", in, out)
		}
	})
}
