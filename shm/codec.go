package shm

import "encoding/binary"

// encodeResponse lays out a response as stored: status (u16), the lengths
// of content type, location and content encoding (u16 each), then the
// three and the body. (Records stored before the content encoding had 0
// in its place: none.) A field longer than 65535 bytes is cut there.
func encodeResponse(r *Response) []byte {
	ct, loc, ce := clip16(r.ContentType), clip16(r.Location), clip16(r.ContentEncoding)
	b := make([]byte, 8, 8+len(ct)+len(loc)+len(ce)+len(r.Body))
	binary.LittleEndian.PutUint16(b[0:], uint16(r.Status))
	binary.LittleEndian.PutUint16(b[2:], uint16(len(ct)))
	binary.LittleEndian.PutUint16(b[4:], uint16(len(loc)))
	binary.LittleEndian.PutUint16(b[6:], uint16(len(ce)))
	b = append(b, ct...)
	b = append(b, loc...)
	b = append(b, ce...)
	return append(b, r.Body...)
}

func clip16(s string) string { return s[:min(len(s), 0xffff)] }

func decodeResponse(b []byte, dst *Response) bool {
	if len(b) < 8 {
		return false
	}
	ct := 8 + int(binary.LittleEndian.Uint16(b[2:]))
	loc := ct + int(binary.LittleEndian.Uint16(b[4:]))
	ce := loc + int(binary.LittleEndian.Uint16(b[6:]))
	if ce > len(b) {
		return false
	}
	dst.Status = int(binary.LittleEndian.Uint16(b[0:]))
	dst.ContentType = string(b[8:ct])
	dst.Location = string(b[ct:loc])
	dst.ContentEncoding = string(b[loc:ce])
	dst.Body = b[ce:]
	return true
}
