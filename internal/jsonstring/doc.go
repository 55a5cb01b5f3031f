// Package jsonstring writes JSON strings into a caller's buffer without
// allocating: the escaping that the access log's JSON lines and the
// problem+json answers share. What becomes of a byte outside printable
// ASCII is the caller's choice ([NonASCII]); either way the output is
// valid JSON whatever bytes a client sent.
//
// It holds no state and is safe for concurrent use. The call most users
// want is [Append].
package jsonstring
