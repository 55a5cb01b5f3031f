package wiretest

import (
	"bytes"
	"io"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// H2Stream sends one HTTP/2 stream on c, a connection that agreed on h2
// and has seen nothing yet: the client preface, SETTINGS, a HEADERS of
// fields (name, value pairs, pseudo-fields included as they are, since no
// client would send some of them), then the DATA frames given, the last
// ending the stream (none: the headers end it). It reads until the
// stream ends, is reset or the connection goes away, and returns the
// response's :status ("" when none came) and body; err is a read's error.
func H2Stream(c io.ReadWriter, fields, data []string) (status, body string, err error) {
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := 0; i+1 < len(fields); i += 2 {
		enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndStream: len(data) == 0, EndHeaders: true, BlockFragment: hb.Bytes()})
	for i, d := range data {
		fr.WriteData(1, i == len(data)-1, []byte(d))
	}
	dec := hpack.NewDecoder(4096, nil)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return status, body, err
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			hs, _ := dec.DecodeFull(f.HeaderBlockFragment())
			for _, h := range hs {
				if h.Name == ":status" {
					status = h.Value
				}
			}
			if f.StreamEnded() {
				return status, body, nil
			}
		case *http2.DataFrame:
			body += string(f.Data())
			if f.StreamEnded() {
				return status, body, nil
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			return status, body, nil
		}
	}
}
