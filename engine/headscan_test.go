package engine_test

import (
	"testing"

	"github.com/preforkd/preforkd/engine"
)

// HeadScan over reads as they come: a bare LF in the section being read
// is refused at once; one in the bytes read ahead after a section is
// refused at the next section's start only when the request had no body
// (they were that next section, not a body).
func TestHeadScan(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reads    []string
		bodyless bool // the request whose section the first read ends
		bareLF   bool // a read reports a bare LF
		refuse   bool // the next section is refused at its start
	}{
		{name: "whole", reads: []string{"GET / HTTP/1.1\r\nHost: a\r\n\r\n"}},
		{name: "bare LF", reads: []string{"GET / HTTP/1.1\nHost: a\r\n\r\n"}, bareLF: true},
		{name: "CR and LF in two reads", reads: []string{"GET / HTTP/1.1\r", "\nHost: a\r\n\r\n"}},
		{name: "a body is not checked", reads: []string{"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\na\nb"}},
		{name: "the next section read ahead", reads: []string{"GET / HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nHost: a\n\n"}, bodyless: true, refuse: true},
		{name: "a body read ahead", reads: []string{"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\na\nb"}, refuse: false},
		{name: "a good section read ahead", reads: []string{"GET / HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r", "\nHost: a\r\n\r\n"}, bodyless: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h engine.HeadScan
			h.Start()
			bare := false
			for _, r := range tc.reads {
				bare = bare || h.Scan([]byte(r))
			}
			h.Bodyless = tc.bodyless
			h.Start()
			if bare != tc.bareLF || h.Refuse() != tc.refuse {
				t.Errorf("bare LF %v, next refused %v; want %v, %v", bare, h.Refuse(), tc.bareLF, tc.refuse)
			}
		})
	}
}
