package core

import (
	"net/textproto"
	"slices"
	"testing"
)

// A field that may make the application run another method's handler
// changes its answer: each is in the cache's primary key. Both lists hold
// canonical forms, as the request's fields are looked up by.
func TestURLFieldsHoldTheMethodOverrides(t *testing.T) {
	for _, name := range methodOverrides {
		if !slices.Contains(urlFields[:], name) {
			t.Errorf("%s is not in urlFields", name)
		}
		if c := textproto.CanonicalMIMEHeaderKey(name); c != name {
			t.Errorf("%s is not canonical: %s", name, c)
		}
	}
}
