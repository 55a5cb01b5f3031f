// Package engine is what preforkd's HTTP engines share: the [server]
// timeouts and limits every engine honours ([Limits]), the upstream
// client's ([Upstream]), and the rule a retiring worker's engine drains
// by ([DrainIdleGrace], [DrainNewGrace]). Each engine (the event loop in
// engine/loop, the daemon's; the fasthttp one in package proxy; the
// net/http one in engine/nethttp) takes these as they are, so that one setting means one thing whichever engine serves, and
// a default is written once, here.
//
// What the engines do alike to the bytes they carry is written here once
// too: the HTTP/1.1 header field rules and the refusals of a request
// (field.go, refusal.go), the fields added to the head sent upstream
// (upstreamhead.go), the rules of the upstream's response head
// (response.go), the sending of a streamed request body and the
// reading of a chunked response (send.go, chunked.go), and the counters
// an engine server reports (stats.go).
//
// An engine carries bytes: package core runs every request.
package engine
