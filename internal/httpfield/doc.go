// Package httpfield holds the pieces of the HTTP field-value grammar
// (RFC 9110 §5.6) that more than one of preforkd's parsers read: the
// optional whitespace around a value ([TrimOWS]), a token of a list
// ([HasToken]). It holds no state and
// is safe for concurrent use; nothing in it allocates.
package httpfield
