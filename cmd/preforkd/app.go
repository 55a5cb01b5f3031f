package main

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/valyala/fasthttp"
)

const demoUpstream = "builtin:demo"

// demoCacheable is the prefix of the demo's paths that a cache may keep.
const demoCacheable = "/cacheable/"

// fastDemo is demo for the fasthttp engine (server.engine = "fasthttp").
func fastDemo(worker int) fasthttp.RequestHandler {
	pid := strconv.Itoa(os.Getpid())
	w := strconv.Itoa(worker)
	return func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		path := ctx.Path()
		if strings.HasPrefix(b2s(path), demoCacheable) {
			ctx.Response.Header.Set("Cache-Control", "max-age=60")
		}
		ctx.Response.SetBodyRaw(appendDemo(ctx.Response.Body()[:0], b2s(ctx.Method()), b2s(path), w, pid))
	}
}

// demoHTTP is demo for the net/http engine (a TLS listener): the same
// answers.
func demoHTTP(worker int) http.Handler {
	pid := strconv.Itoa(os.Getpid())
	w := strconv.Itoa(worker)
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		h := rw.Header()
		h.Set("Content-Type", "application/json")
		path := r.URL.EscapedPath()
		if strings.HasPrefix(path, demoCacheable) {
			h.Set("Cache-Control", "max-age=60")
		}
		b := appendDemo(make([]byte, 0, 128), r.Method, path, w, pid)
		h.Set("Content-Length", strconv.Itoa(len(b)))
		rw.Write(b)
	})
}

// appendDemo appends the demo's JSON body to dst.
func appendDemo(dst []byte, method, path, worker, pid string) []byte {
	dst = append(dst, `{"method":`...)
	dst = appendJSONString(dst, method)
	dst = append(dst, `,"path":`...)
	dst = appendJSONString(dst, path)
	dst = append(dst, `,"worker":`...)
	dst = append(dst, worker...)
	dst = append(dst, `,"pid":`...)
	dst = append(dst, pid...)
	return append(dst, "}\n"...)
}

// b2s is b as a string without copying, for reading only during a call.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control bytes escaped, invalid UTF-8 replaced by U+FFFD.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		case c < utf8.RuneSelf:
			dst = append(dst, c)
		default:
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				dst = append(dst, `\ufffd`...)
			} else {
				dst = append(dst, s[i:i+n]...)
			}
			i += n
			continue
		}
		i++
	}
	return append(dst, '"')
}
