package main

import (
	"bytes"
	"net/http"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

const demoUpstream = "builtin:demo"

// demoCacheable is the prefix of the demo's paths that a cache may keep.
var demoCacheable = []byte("/cacheable/")

// demo answers every request with 200 and a small JSON body naming the
// method, path and worker, so that preforkd runs with nothing else. A
// path under /cacheable/ may be cached for a minute (Cache-Control), so
// that a [[cache]] block can be tried with it at once.
func demo(worker int) fasthttp.RequestHandler {
	pid := strconv.Itoa(os.Getpid())
	w := strconv.Itoa(worker)
	return func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		if bytes.HasPrefix(ctx.Path(), demoCacheable) {
			ctx.Response.Header.Set("Cache-Control", "max-age=60")
		}
		b := ctx.Response.Body()[:0]
		b = append(b, `{"method":`...)
		b = appendJSONString(b, ctx.Method())
		b = append(b, `,"path":`...)
		b = appendJSONString(b, ctx.Path())
		b = append(b, `,"worker":`...)
		b = append(b, w...)
		b = append(b, `,"pid":`...)
		b = append(b, pid...)
		b = append(b, "}\n"...)
		ctx.Response.SetBodyRaw(b)
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
		if strings.HasPrefix(path, string(demoCacheable)) {
			h.Set("Cache-Control", "max-age=60")
		}
		b := make([]byte, 0, 128)
		b = append(b, `{"method":`...)
		b = appendJSONString(b, []byte(r.Method))
		b = append(b, `,"path":`...)
		b = appendJSONString(b, []byte(path))
		b = append(b, `,"worker":`...)
		b = append(b, w...)
		b = append(b, `,"pid":`...)
		b = append(b, pid...)
		b = append(b, "}\n"...)
		h.Set("Content-Length", strconv.Itoa(len(b)))
		rw.Write(b)
	})
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control bytes escaped, invalid UTF-8 replaced by U+FFFD.
func appendJSONString(dst, s []byte) []byte {
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
			r, n := utf8.DecodeRune(s[i:])
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
