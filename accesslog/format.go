package accesslog

import (
	"strconv"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/internal/jsonstring"
	"github.com/preforkd/preforkd/internal/textvalue"
)

// Format is how a line is written.
type Format uint8

const (
	// Combined is nginx's combined format, as nginx writes it (its nine
	// fields, so that every tool that reads nginx's logs reads these),
	// followed by preforkd's fields as key=value pairs:
	//
	//	192.0.2.7 - - [10/Oct/2026:13:55:36 +0000] "GET /a?b=1 HTTP/1.1" 200 2326 "-" "curl/8.5.0" request_id=5f0c… request_time=0.004 upstream_time=0.003 rule=- cache=MISS worker=2 scheme=http
	//
	// The request's target is the one the client sent, an absolute-form
	// "http://host/p?q" whole (nginx's $request). Times are in seconds
	// with millisecond precision; "-" is a value that is not there
	// (upstream_time when the request never reached the application, rule when none refused it, cache when no block applied,
	// request_id when ids are off). scheme is the listener's, http or
	// https: with a cleartext port beside TLS, which one. Bytes that are not printable ASCII,
	// '"' and '\' are written as \xHH, as nginx does.
	Combined Format = iota
	// JSON is one object per line:
	//
	//	{"time":"2026-10-10T13:55:36.123Z","client":"192.0.2.7","method":"GET","target":"/a?b=1","protocol":"HTTP/1.1","scheme":"http","status":200,"bytes":2326,"duration":0.004211,"upstream_time":0.003105,"rule":null,"cache":"MISS","request_id":"5f0c…","worker":2,"referer":null,"user_agent":"curl/8.5.0"}
	//
	// target is as in Combined. Durations are seconds (numbers,
	// microsecond precision); a value that is not there is null.
	JSON
)

var formatNames = textvalue.Enum[Format]{"combined", "json"}

func (f Format) String() string               { return formatNames.String(f, "Format") }
func (f Format) MarshalText() ([]byte, error) { return formatNames.Marshal("accesslog", f) }

// UnmarshalText takes "combined" or "json".
func (f *Format) UnmarshalText(b []byte) error {
	return formatNames.Unmarshal("accesslog", b, f)
}

// stamp is a second's $time_local, made once a second.
type stamp struct {
	sec int64
	b   []byte
}

// timeLocal appends t as nginx's $time_local, 10/Oct/2026:13:55:36 +0000.
func (l *Log) timeLocal(dst []byte, t time.Time) []byte {
	sec := t.Unix()
	if s := l.stamp.Load(); s != nil && s.sec == sec {
		return append(dst, s.b...)
	}
	b := t.AppendFormat(nil, "02/Jan/2006:15:04:05 -0700")
	l.stamp.Store(&stamp{sec, b})
	return append(dst, b...)
}

// appendCombined appends e's line in the combined format.
func (l *Log) appendCombined(dst []byte, e *core.AccessEntry) []byte {
	dst = appendAddr(dst, e)
	dst = append(dst, " - - ["...)
	dst = l.timeLocal(dst, e.Time)
	dst = append(dst, `] "`...)
	dst = appendEscaped(dst, e.Method)
	dst = append(dst, ' ')
	if e.Target != "" {
		dst = appendEscaped(dst, e.Target)
	} else {
		dst = appendEscaped(dst, e.Path)
		if e.Query != "" {
			dst = append(dst, '?')
			dst = appendEscaped(dst, e.Query)
		}
	}
	dst = append(dst, ' ')
	dst = appendEscaped(dst, e.Proto)
	dst = append(dst, `" `...)
	dst = strconv.AppendInt(dst, int64(e.Status), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, e.Bytes, 10)
	dst = append(dst, ` "`...)
	dst = appendOrDash(dst, e.Referer)
	dst = append(dst, `" "`...)
	dst = appendOrDash(dst, e.UserAgent)
	dst = append(dst, `" request_id=`...)
	if len(e.RequestID) > 0 {
		dst = appendEscaped(dst, e.RequestID)
	} else {
		dst = append(dst, '-')
	}
	dst = append(dst, " request_time="...)
	dst = appendSeconds(dst, e.Duration, 3)
	dst = append(dst, " upstream_time="...)
	if e.Upstream >= 0 {
		dst = appendSeconds(dst, e.Upstream, 3)
	} else {
		dst = append(dst, '-')
	}
	dst = append(dst, " rule="...)
	dst = appendOrDash(dst, e.Rule)
	dst = append(dst, " cache="...)
	dst = appendOrDash(dst, e.Cache)
	dst = append(dst, " worker="...)
	dst = strconv.AppendInt(dst, int64(e.Worker), 10)
	dst = append(dst, " scheme="...)
	dst = appendOrDash(dst, e.Scheme)
	return append(dst, '\n')
}

func appendAddr(dst []byte, e *core.AccessEntry) []byte {
	if !e.Client.IsValid() {
		return append(dst, '-')
	}
	return e.Client.AppendTo(dst)
}

func appendOrDash(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, '-')
	}
	return appendEscaped(dst, s)
}

// appendEscaped appends s with '"', '\' and every byte that is not
// printable ASCII as \xHH (nginx's escape=default).
func appendEscaped[S string | []byte](dst []byte, s S) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			dst = append(dst, '\\', 'x', hex[c>>4], hex[c&0xf])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

// appendSeconds appends d in seconds with prec decimals.
func appendSeconds(dst []byte, d time.Duration, prec int) []byte {
	return strconv.AppendFloat(dst, max(d, 0).Seconds(), 'f', prec, 64)
}

// appendJSON appends e's line as a JSON object.
func appendJSON(dst []byte, e *core.AccessEntry) []byte {
	dst = append(dst, `{"time":"`...)
	dst = e.Time.AppendFormat(dst, "2006-01-02T15:04:05.000Z07:00")
	dst = append(dst, `","client":`...)
	if e.Client.IsValid() {
		dst = append(dst, '"')
		dst = e.Client.AppendTo(dst)
		dst = append(dst, '"')
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"method":`...)
	dst = jsonstring.Append(dst, e.Method, jsonstring.Latin1)
	dst = append(dst, `,"target":"`...)
	if e.Target != "" {
		dst = jsonstring.AppendText(dst, e.Target, jsonstring.Latin1)
	} else {
		dst = jsonstring.AppendText(dst, e.Path, jsonstring.Latin1)
		if e.Query != "" {
			dst = append(dst, '?')
			dst = jsonstring.AppendText(dst, e.Query, jsonstring.Latin1)
		}
	}
	dst = append(dst, `","protocol":`...)
	dst = jsonstring.Append(dst, e.Proto, jsonstring.Latin1)
	dst = append(dst, `,"scheme":`...)
	dst = appendJSONOrNull(dst, e.Scheme)
	dst = append(dst, `,"status":`...)
	dst = strconv.AppendInt(dst, int64(e.Status), 10)
	dst = append(dst, `,"bytes":`...)
	dst = strconv.AppendInt(dst, e.Bytes, 10)
	dst = append(dst, `,"duration":`...)
	dst = appendSeconds(dst, e.Duration, 6)
	dst = append(dst, `,"upstream_time":`...)
	if e.Upstream >= 0 {
		dst = appendSeconds(dst, e.Upstream, 6)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"rule":`...)
	dst = appendJSONOrNull(dst, e.Rule)
	dst = append(dst, `,"cache":`...)
	dst = appendJSONOrNull(dst, e.Cache)
	dst = append(dst, `,"request_id":`...)
	if len(e.RequestID) > 0 {
		dst = jsonstring.Append(dst, e.RequestID, jsonstring.Latin1)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"worker":`...)
	dst = strconv.AppendInt(dst, int64(e.Worker), 10)
	dst = append(dst, `,"referer":`...)
	dst = appendJSONOrNull(dst, e.Referer)
	dst = append(dst, `,"user_agent":`...)
	dst = appendJSONOrNull(dst, e.UserAgent)
	return append(dst, "}\n"...)
}

func appendJSONOrNull(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "null"...)
	}
	return jsonstring.Append(dst, s, jsonstring.Latin1)
}
