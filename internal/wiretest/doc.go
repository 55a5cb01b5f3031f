// Package wiretest holds the raw HTTP/1.1 ends of tests that write the
// wire by hand: slow, never-ending and patterned clients, an accept loop,
// and an upstream that records every request as it arrived.
package wiretest
