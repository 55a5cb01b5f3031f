package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/shm"
)

// TestValuesAtTheirEdges checks values at and past the edges of their
// range: each is refused at the line marked "<-" with a message that
// names the key, the value and what is allowed, however the file writes
// it and whether or not the rest of the file makes use of it.
func TestValuesAtTheirEdges(t *testing.T) {
	const redis = "[redis]\nurl = \"redis://127.0.0.1:6379\"\n"
	for _, tc := range []struct {
		name, src string
		want      []string // each in the message
	}{
		// go-redis takes the pool size as an int32 and fills a
		// semaphore of that many tokens as each worker starts: past
		// MaxInt32 the worker panicked, at 1e9 it took 20 s and GiBs.
		{"redis pool past int32", redis + "pool_size = 2147483648 # <-\n",
			[]string{"redis.pool_size: must be between 0 and 10000, got 2147483648"}},
		{"redis pool absurd", redis + "pool_size = 1000000000 # <-\n",
			[]string{"redis.pool_size: must be between 0 and 10000, got 1000000000"}},
		{"redis pool just past", redis + "pool_size = 10001 # <-\n",
			[]string{"redis.pool_size: must be between 0 and 10000, got 10001"}},

		// A window in seconds past what the shape check takes is
		// positive: the message says how long a window may be.
		{"window of too many seconds", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = 4294967297 # <-\n",
			[]string{"ratelimit[1].window", "4294967297 seconds", "at most 17592186 seconds"}},
		{"override window of too many seconds", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = 1\n[[ratelimit.override]]\nkey = \"k\"\nlimit = 2\nwindow = 99999999999 # <-\n",
			[]string{"ratelimit[1].override[1].window", "99999999999 seconds", "at most 17592186 seconds"}},

		// An integer past int64 is the decoder's error; it names the
		// key and the range all the same.
		{"20-digit integer", "[server]\nworkers = 99999999999999999999 # <-\n",
			[]string{"server.workers", "99999999999999999999", "out of range", "9223372036854775807"}},
		{"20-digit integer in an array of tables", rule + "[[ratelimit]]\nname = \"b\"\npath = \"/b\"\nwindow = \"1s\"\n  limit = -99999999999999999999 # <-\n",
			[]string{"ratelimit[2].limit", "-99999999999999999999", "out of range"}},
		{"20-digit integer in an override", rule + "[[ratelimit.override]]\nkey = \"k\"\n[[ratelimit.override]]\nkey = \"j\"\nlimit = 99999999999999999999 # <-\n",
			[]string{"ratelimit[1].override[2].limit", "99999999999999999999", "out of range"}},
		{"20-digit size", "[table]\nresponse_bytes = 99999999999999999999 # <-\n",
			[]string{"table.response_bytes", "99999999999999999999", "out of range"}},
		{"20-digit integer in an inline table", "admin = { listen = \"\" }\ntable = { counters = 99999999999999999999 } # <-\n",
			[]string{"table.counters", "99999999999999999999", "out of range"}},

		// The response table's bounds hold whether or not a block makes
		// one: README gives them, and a block added later would meet
		// them only at the next start.
		{"responses past the maximum, no block", "[table]\nresponses = 1000000000000 # <-\n",
			[]string{"table.responses", "1000000000000", "67108864"}},
		{"responses just past the maximum, no block", "[table]\nresponses = 67108865 # <-\n",
			[]string{"table.responses", "67108865", "67108864"}},
		{"responses past the maximum, with a block", "[table]\nresponses = 67108865 # <-\n[[idempotency]]\npath = \"/o\"\n",
			[]string{"table.responses", "67108865", "67108864"}},
		{"response bytes past the maximum, no block", "[table]\nresponse_bytes = \"8388607TiB\" # <-\n",
			[]string{"table.response_bytes", "9223370937343148032", "17592186036224"}},
		{"response bytes just past the maximum, with a block", "[table]\nresponse_bytes = 17592186040320 # <-\n[[idempotency]]\npath = \"/o\"\n",
			[]string{"table.response_bytes", "17592186040320", "17592186036224"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line := markedLine(t, tc.src)
			_, err := Parse([]byte(tc.src), "t.toml")
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse = %v, want an *Error\n%s", err, tc.src)
			}
			if e.Line != line {
				t.Errorf("Parse = %q: line %d, want %d", err, e.Line, line)
			}
			for _, w := range tc.want {
				if !strings.Contains(e.Msg, w) {
					t.Errorf("Parse = %q: want %q in the message", err, w)
				}
			}
		})
	}
	// Values at the edges are taken.
	for _, src := range []string{
		redis + "pool_size = 10000\n",
		"[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = 17592186\n",
		"[table]\nresponses = 67108864\nresponse_bytes = 17592186036224\n",
	} {
		if _, err := Parse([]byte(src), "t.toml"); err != nil {
			t.Errorf("Parse(%q) = %v, want it taken", src, err)
		}
	}
}

// The response table's bounds that check states are the region's own.
func TestResponseTableBoundsAreTheRegions(t *testing.T) {
	at := shm.Options{Counters: 8, Responses: maxResponses, ResponseBytes: int64(maxResponseBytes)}
	if _, err := at.Normalized(); err != nil {
		t.Errorf("the region refuses the bounds check takes: %v", err)
	}
	for _, past := range []shm.Options{
		{Counters: 8, Responses: maxResponses + 1},
		{Counters: 8, Responses: 16, ResponseBytes: int64(maxResponseBytes) + responseBlock},
	} {
		if _, err := past.Normalized(); err == nil {
			t.Errorf("the region takes %+v, past the bounds check takes", past)
		}
	}
}

// A duplicate that waits "until-done" waits as long as the two upstream
// timeouts together: at their longest, their sum wrapped around to a
// negative wait, and the file was refused for a wait it did not write.
func TestUntilDoneOfTheLongestTimeouts(t *testing.T) {
	src := "[server]\nupstream_connect_timeout = \"2562047h\"\nupstream_timeout = \"2562047h\"\n[[idempotency]]\npath = \"/o\"\nwait = \"until-done\"\n"
	c, err := Parse([]byte(src), "t.toml")
	if err != nil {
		t.Fatalf("Parse = %v, want it taken", err)
	}
	if w := c.Server.UntilDone(); w < c.Server.UpstreamTimeout {
		t.Errorf("UntilDone = %v, want at least upstream_timeout (%v)", w, c.Server.UpstreamTimeout)
	}
}
