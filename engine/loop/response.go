//go:build linux

package loop

import (
	"errors"

	"github.com/preforkd/preforkd/engine"
)

// The upstream's response head (RFC 9112 §4, §6.3) is checked by
// engine.ResponseHead before anything of it reaches a client, as the
// net/http engine's forwarder checks it.

var (
	errRespClosed = errors.New("loop: the upstream closed the connection before a whole response")
	errRespCut    = errors.New("loop: the upstream's response did not reach its end")
)

// respHead is a parsed response head, its first fields indexed without
// allocating.
type respHead struct {
	engine.ResponseHead
	inline [inlineFields]engine.Field
}

// upgrades is the head's Upgrade lines as one list.
func (h *respHead) upgrades() (list []byte) {
	for _, f := range h.Fields {
		if f.Kind == engine.FieldUpgrade {
			list = append(append(list, ','), f.Value.Of(h.Raw)...)
		}
	}
	return list
}

// parse indexes raw, a whole head (scanHead).
func (h *respHead) parse(raw []byte) (err error) {
	h.ResponseHead, err = engine.ParseResponseHead(raw, h.inline[:0])
	return err
}
