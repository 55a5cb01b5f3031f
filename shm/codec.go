package shm

import "encoding/binary"

// encodeResponse lays out a response as stored: status (u16), the lengths
// of content type and location (u16 each), 2 spare bytes, then the three.
func encodeResponse(r *Response) []byte {
	ct, loc := r.ContentType, r.Location
	if len(ct) > 0xffff {
		ct = ct[:0xffff]
	}
	if len(loc) > 0xffff {
		loc = loc[:0xffff]
	}
	b := make([]byte, 8, 8+len(ct)+len(loc)+len(r.Body))
	binary.LittleEndian.PutUint16(b[0:], uint16(r.Status))
	binary.LittleEndian.PutUint16(b[2:], uint16(len(ct)))
	binary.LittleEndian.PutUint16(b[4:], uint16(len(loc)))
	b = append(b, ct...)
	b = append(b, loc...)
	return append(b, r.Body...)
}

func decodeResponse(b []byte, dst *Response) bool {
	if len(b) < 8 {
		return false
	}
	ctLen, locLen := int(binary.LittleEndian.Uint16(b[2:])), int(binary.LittleEndian.Uint16(b[4:]))
	if 8+ctLen+locLen > len(b) {
		return false
	}
	dst.Status = int(binary.LittleEndian.Uint16(b[0:]))
	dst.ContentType = string(b[8 : 8+ctLen])
	dst.Location = string(b[8+ctLen : 8+ctLen+locLen])
	dst.Body = b[8+ctLen+locLen:]
	return true
}
