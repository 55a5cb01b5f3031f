package main

import (
	"os"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/engine/loop"
)

const demoUpstream = "builtin:demo"

// demoCacheable is the prefix of the demo's paths that a cache may keep.
const demoCacheable = "/cacheable/"

// demo answers every request with 200 and a small JSON body naming the
// method, path and worker, so that preforkd runs with nothing else. A
// path under /cacheable/ may be cached for a minute (Cache-Control), so
// that a [[cache]] block can be tried with it at once. It is served by
// the event-loop engine, in the worker, and allocates nothing.
func demo(worker int) loop.App {
	pid := strconv.Itoa(os.Getpid())
	w := strconv.Itoa(worker)
	return func(resp *loop.AppResponse, req *loop.AppRequest) {
		resp.Header("Content-Type", "application/json")
		path := req.Path()
		if strings.HasPrefix(path, demoCacheable) {
			resp.Header("Cache-Control", "max-age=60")
		}
		b := resp.Body()[:0]
		b = append(b, `{"method":`...)
		b = appendJSONString(b, req.Method())
		b = append(b, `,"path":`...)
		b = appendJSONString(b, path)
		b = append(b, `,"worker":`...)
		b = append(b, w...)
		b = append(b, `,"pid":`...)
		b = append(b, pid...)
		b = append(b, "}\n"...)
		resp.SetBody(b)
	}
}

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
		b := ctx.Response.Body()[:0]
		b = append(b, `{"method":`...)
		b = appendJSONString(b, b2s(ctx.Method()))
		b = append(b, `,"path":`...)
		b = appendJSONString(b, b2s(path))
		b = append(b, `,"worker":`...)
		b = append(b, w...)
		b = append(b, `,"pid":`...)
		b = append(b, pid...)
		b = append(b, "}\n"...)
		ctx.Response.SetBodyRaw(b)
	}
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
