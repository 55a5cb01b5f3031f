package proxy

import "bytes"

// appendForwardPath appends to dst the path p (as sent, starting with '/')
// with its dot segments removed (RFC 3986 §5.2.4; "%2e" counts as a dot)
// and its repeated slashes merged, as Envoy's normalize_path and
// merge_slashes do: "/a//b/./c/../d" is forwarded as "/a/b/d". A trailing
// slash is kept ("/a/b/.." is "/a/"); percent-encodings are otherwise
// passed as sent. This is the path an upstream sees when no Gate gives
// one (Exchange.ForwardPath); the Gate's rule matching normalizes further.
func appendForwardPath(dst, p []byte) []byte {
	if isForwardClean(p) {
		return append(dst, p...)
	}
	start := len(dst)
	dst = append(dst, '/') // dst[start:] ends in '/' throughout the loop
	endsInName := false
	for len(p) > 0 {
		for len(p) > 0 && p[0] == '/' {
			p = p[1:] // repeated slashes are merged
		}
		if len(p) == 0 {
			break
		}
		seg := p
		if i := bytes.IndexByte(p, '/'); i >= 0 {
			seg, p = p[:i], p[i:]
		} else {
			p = nil
		}
		endsInName = false
		switch dots(seg) {
		case 1: // "."
		case 2: // "..": drop the previous segment, if any
			if len(dst)-start > 1 {
				i := bytes.LastIndexByte(dst[start:len(dst)-1], '/')
				dst = dst[:start+i+1]
			}
		default:
			dst = append(dst, seg...)
			dst = append(dst, '/')
			endsInName = p == nil
		}
	}
	// A path ending in a name loses the slash the loop added; one ending
	// in a slash or a dot segment keeps it: "/a/b/.." is "/a/".
	if endsInName {
		dst = dst[:len(dst)-1]
	}
	return dst
}

// isForwardClean reports whether p needs no rewriting: no empty segment
// but a trailing one, no "." or ".." (or "%2e") segment.
func isForwardClean(p []byte) bool {
	for i := 0; i < len(p); i++ {
		if p[i] != '/' {
			continue
		}
		if i+1 < len(p) {
			switch p[i+1] {
			case '/', '.', '%':
				j := bytes.IndexByte(p[i+1:], '/')
				seg := p[i+1:]
				if j >= 0 {
					seg = seg[:j]
				}
				if len(seg) == 0 || dots(seg) != 0 {
					return false
				}
			}
		}
	}
	return true
}

// dots returns 1 for a "." segment, 2 for "..", 0 otherwise; "%2e" (any
// case) counts as a dot, as decoders upstream will see it.
func dots(seg []byte) int {
	n := 0
	for len(seg) > 0 {
		switch {
		case seg[0] == '.':
			seg = seg[1:]
		case len(seg) >= 3 && seg[0] == '%' && seg[1] == '2' && (seg[2] == 'e' || seg[2] == 'E'):
			seg = seg[3:]
		default:
			return 0
		}
		n++
	}
	if n > 2 {
		return 0
	}
	return n
}
