package proxy

import (
	"bufio"
	"bytes"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Date is the server's to write (fasthttp's NoDefaultDate), so that a
// response keeps its own: the stored one on a cache hit (a cache must
// not change it, RFC 9111 §4; RFC 9110 §6.6.1), the application's on a
// miss. fasthttp drops a Date set like any other field (it manages the
// field itself); only a header it reads keeps one. So each response
// header starts as one read from a status line and a Date line
// (primeDate), once, where the response is made: the core's answer
// (respond), the application's (copyResponseHeader, runApp), OPTIONS *.
// A header that fasthttp resets (every problem answer) gets fasthttp's
// own Date again.

// dateValue is the current Date value, formatted once a second.
type dateValue struct {
	sec int64
	b   []byte
}

var currentDate atomic.Pointer[dateValue]

// now is the Date value for the current second.
func now() []byte {
	t := time.Now()
	if d := currentDate.Load(); d != nil && d.sec == t.Unix() {
		return d.b
	}
	d := &dateValue{sec: t.Unix(), b: t.UTC().AppendFormat(nil, http.TimeFormat)}
	currentDate.Store(d)
	return d.b
}

// primer reads a header section from memory.
type primer struct {
	buf []byte
	rd  bytes.Reader
	br  *bufio.Reader
}

var primers = sync.Pool{New: func() any {
	p := &primer{}
	p.br = bufio.NewReaderSize(&p.rd, 128)
	return p
}}

// primeDate makes h a new header with one field, Date: date (an
// HTTP-date, at most 64 bytes, else the time now).
func primeDate(h *fasthttp.ResponseHeader, date []byte) {
	if len(date) == 0 || len(date) > 64 || bytes.ContainsAny(date, "\r\n") {
		date = now()
	}
	p := primers.Get().(*primer)
	// A 204 read as such has no framing of its own (no Content-Length,
	// no close); the status is then the default again, as in a new
	// header, and no status line of the read one is kept.
	p.buf = append(append(append(p.buf[:0], "HTTP/1.1 204 No Content\r\nDate: "...), date...), "\r\n\r\n"...)
	p.rd.Reset(p.buf)
	p.br.Reset(&p.rd)
	_ = h.Read(p.br) // a head of our own: it reads
	primers.Put(p)
	h.SetStatusCode(0)
	h.SetStatusMessage(nil)
	h.SetProtocol(nil)
}
