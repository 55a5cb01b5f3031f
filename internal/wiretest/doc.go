// Package wiretest holds the raw HTTP/1.1 ends of tests that write the
// wire by hand: slow, never-ending and patterned clients, an accept loop,
// and an upstream that records every request as it arrived; and one raw
// HTTP/2 stream, for what no HTTP/2 client would send.
package wiretest
