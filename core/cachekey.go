package core

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/preforkd/preforkd/core/httpcache"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// The cache's keys. They are hashed with the region's seeds in namespaces
// of their own; the namespaces are fixed forever, because entries and
// generations are dumped and restored by hash.
//
//   - primary key: the Host as sent (marked on a cleartext listener
//     beside a TLS one), the forward path, the query as sent (an empty
//     one apart from none), and the urlFields a request has. GET and
//     HEAD share it (HEAD is answered from GET's entry). It holds the entry, or a vary stub.
//   - variant key: the primary key and the request's values of the
//     fields the stub names. It holds the entry of a response that varies.
//   - URL: the forward path and the query, whatever the host and however
//     percent-encoded (appendURLID): the generation an unsafe request or
//     a purge by URL advances.
//   - tag: the tag's bytes as the response sent them.
const (
	nsCachePrimary = 0x3a91_5d0c_7e2b_4f01
	nsCacheVariant = 0x3a91_5d0c_7e2b_4f02
	nsCacheURL     = 0x3a91_5d0c_7e2b_4f03
	nsCacheTag     = 0x3a91_5d0c_7e2b_4f04
)

// appendURL appends the request's URL identity (see appendURLID).
func (ex *Exchange) appendURL(b []byte) []byte {
	return appendURLID(b, ex.forward, ex.req.Query())
}

// appendURLID appends the URL identity of a forward path and a query: each
// in the spelling its equivalent spellings share (route.AppendSpelling),
// joined by '?', so that an unsafe request, a Location or a purge that
// spells the URL otherwise than the request that stored it still reaches
// its entries.
func appendURLID(b []byte, forward, query string) []byte {
	b = route.AppendSpelling(b, forward)
	b = append(b, '?')
	return route.AppendSpelling(b, query)
}

// appendPrimary appends the identity of the request's primary key.
func (ex *Exchange) appendPrimary(b []byte) []byte {
	// The Host as the application gets it, case and all: one that tells
	// "WWW.EXAMPLE" from "www.example" (a redirect to its canonical name,
	// a 404 for a host it does not serve) must never have its answer to
	// one served for the other. Browsers send host names in lower case:
	// the entries a case split costs are those of odd clients.
	host, _ := ex.req.Header("Host")
	b = append(b, host...)
	if ex.c.cleartext != nil {
		// The cleartext listener beside a TLS one (Core.Cleartext): its
		// entries apart. The TLS listener's keys are those of an
		// instance without one.
		b = append(b, 0, 'h', 't', 't', 'p')
	}
	b = append(b, 0)
	b = append(b, ex.forward...)
	b = append(b, '?')
	q := ex.req.Query()
	b = append(b, q...)
	if q == "" && emptyQuery(ex.req) {
		b = append(b, 0, '?')
	}
	scheme := "http"
	if s, ok := ex.req.(Scheme); ok {
		scheme = s.Scheme()
	}
	for _, name := range urlFields {
		lines := ex.req.HeaderLines(name, ex.lines[:0])
		switch {
		case len(lines) == 0:
			continue
		case len(lines) > 1:
		case name == hdrForwardedHost && lines[0] == host,
			name == hdrForwardedProto && lines[0] == scheme:
			continue // what the engines forward: the request's own
		}
		n := len(b)
		b = append(b, 0)
		b = append(b, name...)
		b = append(b, ':')
		if name == "Forwarded" {
			if b = appendForwardedURL(b, lines); len(b) == n+len(name)+2 {
				b = b[:n] // no host= nor proto=: the same URL
			}
			continue
		}
		for _, v := range lines {
			b = append(b, v...)
			b = append(b, '\n')
		}
	}
	return b
}

// emptyQuery reports whether the target ends in a '?' with no query after
// it ("/a?"), as the request view's target says (RequestTarget). Every
// engine forwards it so, and an application may answer it otherwise than
// "/a" (a redirect to its canonical URL, which served for "/a" would
// redirect to itself): its primary key is its own, as nginx's
// $request_uri keeps it. The URL identity does not tell them apart: an
// invalidation or purge of one reaches both.
func emptyQuery(r Request) bool {
	t, ok := r.(RequestTarget)
	return ok && strings.HasSuffix(t.Target(), "?")
}

// urlFields are the request fields by which applications behind proxies
// learn another scheme, host, port, path prefix, URL or method than the
// request line and Host say (RFC 7239 Forwarded, and the de facto fields
// of Rack, Spring, Django, Werkzeug, IIS, Tornado, ...), which preforkd passes on
// as sent. A response built from them (a redirect, absolute links) is the
// answer to them only: a request that has one has it in its primary key,
// so that no client can store such a response for those that send none.
// Requests without them, or with the same values (a proxy in front that
// always adds them), share their entries as before. X-Forwarded-Host and
// -Proto are keyed only when they are not the request's own Host and
// scheme: the engines that forward write those themselves, but an
// http.Handler behind engine/nethttp gets a client's as sent. X-Scheme
// is read before X-Forwarded-Proto by Tornado (xheaders) and the WSGI
// ReverseProxied middleware Flask applications copy, which takes its
// path prefix from X-Script-Name: the X-Forwarded-Proto preforkd writes
// does not overrule them. Canonical forms (net/http's header keys).
// Each costs a look through the request's fields on every cached
// request: the list is the fields frameworks actually read.
var urlFields = [...]string{
	"Forwarded", hdrForwardedHost, hdrForwardedProto, "X-Forwarded-Port", "X-Forwarded-Prefix", "X-Forwarded-Scheme", "X-Forwarded-Ssl",
	"X-Scheme", "X-Script-Name", "X-Host", "X-Original-Url", "X-Rewrite-Url",
	"X-Http-Method-Override", "X-Http-Method", "X-Method-Override", // methodOverrides
}

// appendForwardedURL appends the host= and proto= parameters of the
// Forwarded field lines, as sent, each element's that has one ended by
// ','. The other parameters (for=, by=) tell clients and proxies apart,
// not URLs: left out, so that a proxy adding its client's for= does not
// split the cache by client. Lines are split at every ';' and ',', even
// in a quoted string: a parameter an application might see, however
// lenient its parser, is keyed (at worst an extra miss).
func appendForwardedURL(b []byte, lines []string) []byte {
	for _, line := range lines {
		for elem := range strings.SplitSeq(line, ",") {
			had := false
			for pair := range strings.SplitSeq(elem, ";") {
				name, _, ok := strings.Cut(pair, "=")
				if name = strings.Trim(name, " \t"); ok && (strings.EqualFold(name, "host") || strings.EqualFold(name, "proto")) {
					b = append(b, strings.Trim(pair, " \t")...)
					b, had = append(b, ';'), true
				}
			}
			if had {
				b = append(b, ',')
			}
		}
	}
	return b
}

// appendVariant appends the identity of the variant key of the request
// for the Vary names: "name:value,value\n" for a field sent, even empty,
// and "name\n" for one absent, which matches only its absence (RFC 9111
// §4.1). X-Forwarded-For is the value the application gets: the client's
// and then the peer (engine.ForwardedFor), so that a response that varies
// on it is never another address's.
func (ex *Exchange) appendVariant(b []byte, names []string) []byte {
	b = binary.LittleEndian.AppendUint64(b, ex.cache.primary.A)
	b = binary.LittleEndian.AppendUint64(b, ex.cache.primary.B)
	for _, n := range names {
		b = append(b, n...)
		lines := ex.req.HeaderLines(n, ex.lines[:0])
		var peer netip.Addr
		if n == hdrForwardedFor {
			peer = ex.req.Peer()
		}
		if len(lines) == 0 && !peer.IsValid() {
			b = append(b, '\n')
			continue
		}
		b = append(b, ':')
		for i, v := range lines {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, v...)
		}
		if peer.IsValid() {
			if len(lines) > 0 {
				b = append(b, ',')
			}
			b = peer.AppendTo(b)
		}
		b = append(b, '\n')
	}
	return b
}

// hdrForwardedFor is the field the engines forward with the peer appended.
const hdrForwardedFor = "X-Forwarded-For"

// hdrForwardedHost and hdrForwardedProto are the fields the engines that
// forward write themselves: the request's Host, and its scheme.
const (
	hdrForwardedHost  = "X-Forwarded-Host"
	hdrForwardedProto = "X-Forwarded-Proto"
)

// stubNames appends the Vary names of stub e to dst (aliasing e).
func stubNames(e *httpcache.Entry, dst []string) []string {
	for f := e.Fields; len(f) > 0 && len(dst) < httpcache.MaxVary; {
		var n string
		n, _, _, f = httpcache.NextField(f)
		dst = append(dst, n)
	}
	return dst
}

// namesHash identifies a set of Vary names (sorted, each once).
func namesHash(names []string) uint64 {
	var d xxhash.Digest
	for _, n := range names {
		d.WriteString(n)
		d.WriteString("\n")
	}
	return d.Sum64()
}

func (c *Core) urlHash(id []byte) uint64 { return c.region.Counters().KeyOf(nsCacheURL, id).A }

func tagHash(r *shm.Region, tag string) uint64 {
	return r.Counters().KeyOfString(nsCacheTag, tag).A
}

// PurgeTag purges the entries tagged tag (a value of a tag field, as the
// response sent it), in every process of the region at once: one
// generation bump, whatever the number of entries. It reports false for
// a region without a response table, which has no cache.
func PurgeTag(r *shm.Region, tag string) bool {
	return r.Tags().Purge(tagHash(r, tag))
}

// ErrPurgeTarget is PurgeURL's error for a target no request could have.
var ErrPurgeTarget = errors.New("core: purge: not a path with an optional query, or an http(s) URL")

// PurgeURL purges the entries of target, in every process of the region
// at once: every variant, on every host. target is a path with an
// optional query ("/products/1?page=2", as a client sends it) or an
// absolute http:// or https:// URL, whose host is ignored. The path is
// normalized as a request's is (dot segments removed, slashes merged), and
// it and the query match whatever their percent-encoding: "/caf%c3%a9"
// purges what "/café" and "/caf%C3%A9" stored. It reports false for a region without a
// response table; the error (ErrPurgeTarget) is CheckPurgeURL's.
func PurgeURL(r *shm.Region, target string) (bool, error) {
	id, err := purgeID(target)
	if err != nil {
		return false, err
	}
	return r.Tags().Bump(r.Counters().KeyOf(nsCacheURL, id).A), nil
}

// CheckPurgeURL reports what PurgeURL would refuse in target, so that a
// caller with several targets can refuse them all before purging any.
func CheckPurgeURL(target string) error {
	_, err := purgeID(target)
	return err
}

// purgeID is the URL identity of a purge target (see appendURL).
func purgeID(target string) ([]byte, error) {
	if i := strings.Index(target, "://"); i >= 0 {
		scheme := strings.ToLower(target[:i])
		if scheme != "http" && scheme != "https" {
			return nil, ErrPurgeTarget
		}
		rest := target[i+3:]
		j := strings.IndexAny(rest, "/?#")
		if j < 0 {
			target = "/"
		} else {
			target = rest[j:]
			if target[0] != '/' {
				target = "/" + target
			}
		}
	}
	target, _, _ = strings.Cut(target, "#")
	path, query, _ := strings.Cut(target, "?")
	if path == "" || path[0] != '/' {
		return nil, ErrPurgeTarget
	}
	_, fwd, err := route.Normalize(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrPurgeTarget, strings.TrimPrefix(err.Error(), "route: "))
	}
	return appendURLID(nil, fwd, query), nil
}
