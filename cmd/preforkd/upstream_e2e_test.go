package main

// The upstream application of the data-plane end-to-end tests: this test
// binary again, in the proctest role "upstream", in a process of its own,
// so that the daemon forwards to a real application process and the test
// measures only the daemon.

import (
	"bufio"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/internal/wiretest"
	"golang.org/x/sys/unix"
)

// upstreamRole serves the test application on a loopback port, which it
// says first, until its stdin closes (the test binary is gone) or it is
// killed (the test ended).
func upstreamRole(c *proctest.Child) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	if err := c.Say("%s", ln.Addr()); err != nil {
		return err
	}
	var mu sync.Mutex
	seen := map[string]int{}
	mux := http.NewServeMux()
	mux.HandleFunc("/seen", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		json.NewEncoder(w).Encode(seen)
	})
	// /sse sends n events (default 4), every 300ms.
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		if n == 0 {
			n = 4
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range n {
			if i > 0 {
				time.Sleep(300 * time.Millisecond)
			}
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
		}
	})
	// /bytes?n=N sends N patterned bytes, chunked with &chunked=1.
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if r.URL.Query().Get("chunked") == "" {
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		}
		io.Copy(w, wiretest.Pattern(n))
	})
	// /upload answers the length and SHA-256 of the body.
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
	})
	// /request-id answers the X-Request-Id lines it got, comma-separated.
	mux.HandleFunc("/request-id", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, strings.Join(r.Header.Values("X-Request-Id"), ","))
	})
	mux.HandleFunc("/ws", websocketEcho)
	// /cpu works 15ms of its thread's CPU time (as a CPU-bound handler
	// does a fixed amount of work, however long a busy host makes it
	// wait), /sleep sleeps 15ms: the two profiles of preforkd tune's test.
	mux.HandleFunc("/cpu", func(w http.ResponseWriter, r *http.Request) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var ts unix.Timespec
		unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		until := ts.Nano() + int64(15*time.Millisecond)
		x := 0
		for ts.Nano() < until {
			for i := range 1000 {
				x += i * i
			}
			unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		}
		fmt.Fprint(w, x)
	})
	mux.HandleFunc("/sleep", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(15 * time.Millisecond)
		fmt.Fprint(w, "slept")
	})
	defaultsRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/seen" {
			mu.Lock()
			seen[r.Method+" "+r.URL.Path]++
			mu.Unlock()
		}
		mux.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	for {
		if _, err := c.ReadLine(); err != nil {
			return nil
		}
	}
}

const websocketGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// websocketEcho accepts a WebSocket handshake (RFC 6455) and answers every
// text frame with "echo: " and its text, until a close frame.
func websocketEcho(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || r.Header.Get("Sec-WebSocket-Key") == "" {
		http.Error(w, "not a websocket handshake", http.StatusBadRequest)
		return
	}
	sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + websocketGUID))
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(sum[:]))
	brw.Flush()
	for {
		op, payload, err := readFrame(brw.Reader)
		if err != nil || op == 0x8 {
			writeFrame(c, 0x8, nil, false)
			return
		}
		if err := writeFrame(c, 0x1, append([]byte("echo: "), payload...), false); err != nil {
			return
		}
	}
}

// readFrame reads one unfragmented WebSocket frame, unmasking it.
func readFrame(br *bufio.Reader) (op byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, nil, err
	}
	n := int64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		n = int64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		n = int64(binary.BigEndian.Uint64(b[:]))
	}
	var mask [4]byte
	masked := h[1]&0x80 != 0
	if masked {
		if _, err := io.ReadFull(br, mask[:]); err != nil {
			return 0, nil, err
		}
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(br, payload); err != nil {
		return 0, nil, err
	}
	if masked {
		for i := range payload {
			payload[i] ^= mask[i%4]
		}
	}
	return h[0] & 0x0f, payload, nil
}

// writeFrame writes one final frame of opcode op; a client masks it.
func writeFrame(w io.Writer, op byte, payload []byte, mask bool) error {
	b := []byte{0x80 | op}
	m := byte(0)
	if mask {
		m = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, m|byte(n))
	default:
		b = append(b, m|126, byte(n>>8), byte(n))
	}
	if mask {
		key := [4]byte{0x12, 0x34, 0x56, 0x78}
		b = append(b, key[:]...)
		for i, c := range payload {
			b = append(b, c^key[i%4])
		}
	} else {
		b = append(b, payload...)
	}
	_, err := w.Write(b)
	return err
}

// startUpstreamProcess starts the upstream role and returns its address;
// it ends with the test.
func startUpstreamProcess(t *testing.T) string {
	t.Helper()
	addr, err := proctest.Start(t, proctest.Options{Role: "upstream"}).Line(10 * time.Second)
	if err != nil {
		t.Fatalf("the upstream process did not start: %v", err)
	}
	return addr
}

// upstreamSeen returns how many requests the upstream process saw, by
// "METHOD /path".
func upstreamSeen(t *testing.T, addr string) map[string]int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/seen")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	seen := map[string]int{}
	if err := json.NewDecoder(resp.Body).Decode(&seen); err != nil {
		t.Fatal(err)
	}
	return seen
}
