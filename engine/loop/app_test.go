//go:build linux

package loop_test

import (
	"testing"

	"github.com/preforkd/preforkd/engine/loop"
)

// A body an App gives with SetBody stays the App's: the loop reuses the
// body's memory from request to request, and must not write the next
// request's body into a slice the App keeps (a constant answer, say).
func TestAppSetBodyStaysTheApps(t *testing.T) {
	t.Parallel()
	static := []byte("hello, world")
	addr, _ := serve(t, loop.Options{Loops: 1, App: func(w *loop.AppResponse, r *loop.AppRequest) {
		switch r.Path() {
		case "/static":
			w.SetBody(static)
		case "/inplace":
			// The in-place pattern: appended to Body, given back.
			w.SetBody(append(w.Body()[:0], "in place"...))
		default:
			w.WriteString("bye")
		}
	}})
	c, br := dial(t, addr)
	for i, tc := range []struct{ path, want string }{
		{"/static", "hello, world"}, {"/other", "bye"}, {"/static", "hello, world"},
		{"/inplace", "in place"}, {"/other", "bye"}, {"/inplace", "in place"}, {"/static", "hello, world"},
	} {
		if _, body := roundTrip(t, c, br, "GET "+tc.path+" HTTP/1.1\r\nHost: a\r\n\r\n"); string(body) != tc.want {
			t.Errorf("request %d, %s: %q, want %q", i, tc.path, body, tc.want)
		}
	}
	if string(static) != "hello, world" {
		t.Errorf("the App's own body was written over: %q", static)
	}
}
