package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// An embedding program that serves cleartext net/http links only what it
// uses: neither the daemon's parts (fasthttp, go-redis, the TOML parser)
// nor the net/http engine's TLS serving, HTTP/2 and forwarding, nor the
// core's idempotent replay and response cache, each reached only through
// a value a program builds (nethttp.Edge, nethttp.NewUpstream,
// core.IdempotencyBlocks, core.CacheBlocks). So it stays at most 10 MiB.
func TestEmbedLinksOnlyWhatItUses(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the example")
	}
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range []string{"github.com/valyala/fasthttp", "github.com/redis/go-redis/v9", "github.com/BurntSushi/toml",
		"golang.org/x/net/http2", "github.com/preforkd/preforkd/engine/nethttp/tlsedge"} {
		for dep := range strings.FieldsSeq(string(out)) {
			if dep == p || strings.HasPrefix(dep, p+"/") {
				t.Errorf("the example depends on %s", dep)
			}
		}
	}
	// -trimpath: a plain build holds the checkout's directory once for
	// each source file, so its size moves by a page or two with where the
	// checkout is. This bound is the program's; the margin is for the
	// plain build, which the goal is about: it carries the directory names,
	// 16 KB more from a 10-byte checkout directory, 20.4 KB from a 67-byte
	// one (measured at 10,462,602 bytes -trimpath), which 21 KiB covers.
	// The plain build of this checkout is checked against the goal itself
	// below.
	bin := filepath.Join(t.TempDir(), "embed")
	if out, err := exec.Command("go", "build", "-trimpath", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	syms, err := exec.Command("go", "tool", "nm", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool nm: %v\n%s", err, syms)
	}
	for _, s := range []string{
		" crypto/tls.(*Conn).serverHandshake",                        // TLS serving
		" github.com/preforkd/preforkd/engine/nethttp.(*forwarder).", // forwarding
		" github.com/preforkd/preforkd/internal/upconn.",
		" encoding/json.Unmarshal",                                   // prefork's handoff is its own text
		" errors.As\n",                                               // errors.AsType: no reflection
		" runtime/metrics.",                                          // a worker's GC cycles: debug.ReadGCStats
		" os/exec.",                                                  // prefork starts processes with os.StartProcess
		" github.com/preforkd/preforkd/core.(*Exchange).idempotency", // the optional stages
		" github.com/preforkd/preforkd/core.(*Exchange).decideCache",
		" github.com/preforkd/preforkd/core/httpcache.",
		" github.com/preforkd/preforkd/shm.(*Responses).CacheLookup",
		" github.com/preforkd/preforkd/shm.(*Responses).Begin",
		" github.com/preforkd/preforkd/core.(*cacheStream)",               // a large cached body's reading
		" github.com/preforkd/preforkd/engine/nethttp.(*Handler).refresh", // the cache's background refresh
		" github.com/preforkd/preforkd/core.(*Exchange).chargeRedis",      // the Redis rules' round trip
		" github.com/preforkd/preforkd/core.(*Exchange).unavailable",      // and their breaker's answer
		" net/http.(*Request).Clone",                                      // with the multipart form's copying (a cache refresh's copy)
		" github.com/preforkd/preforkd/shm.(*Responses).CacheCopy",
		" github.com/preforkd/preforkd/core.(*Exchange).redirectHTTPS", // the cleartext port's redirect
		" github.com/preforkd/preforkd/metrics.helps",                  // the page's HELP texts
		" github.com/preforkd/preforkd/metrics.newSpecs",               // the schema's names and labels
	} {
		if strings.Contains(string(syms), s) {
			t.Errorf("the example links %s", strings.TrimSpace(s))
		}
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	const limit, margin = 10 << 20, 21 << 10
	t.Logf("go build -trimpath ./examples/embed: %d bytes, %d under 10 MiB", fi.Size(), limit-fi.Size())
	if fi.Size() > limit-margin {
		t.Errorf("go build -trimpath ./examples/embed: %d bytes, less than %d KiB under 10 MiB", fi.Size(), margin>>10)
	}
	plain := filepath.Join(t.TempDir(), "embed")
	if out, err := exec.Command("go", "build", "-o", plain, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if fi, err = os.Stat(plain); err != nil {
		t.Fatal(err)
	}
	t.Logf("go build ./examples/embed: %d bytes, %d under 10 MiB", fi.Size(), limit-fi.Size())
	if fi.Size() > limit {
		t.Errorf("go build ./examples/embed: %d bytes, over 10 MiB", fi.Size())
	}
}
