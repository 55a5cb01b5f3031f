package core

import (
	"bytes"
	"reflect"
	"testing"
	"unsafe"

	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// Core.Cleartext builds its view field by field (a Core holds a pool,
// which must not be copied): a field added to Core and not carried there
// would be zero in the view, and the cleartext port would serve without
// it. Every field but the view's own must be the original's, to the byte.
func TestCleartextCarriesEveryField(t *testing.T) {
	own := map[string]bool{"pool": true, "cleartext": true, "redirect": true}
	c, err := newCore(shmtest.Private(t, shm.Options{Counters: 64, Responses: 8}), Options{HealthPath: "/healthz", RequestID: "X-Request-Id", ResetHeader: "Preforkd-Reset"})
	if err != nil {
		t.Fatal(err)
	}
	v := c.Cleartext(CleartextOptions{Redirect: true, TLSPort: 8443})
	cv, vv := reflect.ValueOf(c).Elem(), reflect.ValueOf(v).Elem()
	for i := range cv.NumField() {
		f := cv.Type().Field(i)
		if own[f.Name] {
			continue
		}
		at := func(s reflect.Value) []byte {
			return unsafe.Slice((*byte)(unsafe.Pointer(s.Field(i).UnsafeAddr())), f.Type.Size())
		}
		if !bytes.Equal(at(cv), at(vv)) {
			t.Errorf("Core.%s is not carried into the Cleartext view: add it there (or, if the view must have its own, to this test's list)", f.Name)
		}
	}
	if v.cleartext == nil || c.cleartext != nil {
		t.Error("the view's cleartext options are not its own")
	}
}
