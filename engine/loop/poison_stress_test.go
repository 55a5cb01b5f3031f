//go:build linux && loop_poison

package loop_test

import (
	"bufio"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine/loop"
	"github.com/preforkd/preforkd/internal/wiretest"
)

const stressRules = "[table]\ncounters = 4096\nresponses = 256\nresponse_bytes = \"2MiB\"\n" +
	"[[cache]]\npath = \"/c/*\"\n" +
	"[[idempotency]]\npath = \"/orders\"\nmax_body = \"4KiB\"\nwait = \"5s\"\n"

func stressBody(p string, n int) string {
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(p)
		b.WriteByte('|')
	}
	return b.String()[:n]
}

// Many clients at once, each with a few pipelined requests of every kind
// (chunked and long responses, cache hits and refreshes, uploads read
// ahead and streamed, idempotent duplicates), some reading slowly, some
// going away midway: every body must come back as the upstream sent it.
// Built with the loop_poison tag only, where buffers given back to their
// pool are filled with 0xAA, so that a slice kept past its buffer's
// return shows: go test -tags loop_poison -race -run TestPoisonedBuffers
// (STRESS_DUR=30s for longer).
func TestPoisonedBuffers(t *testing.T) {
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		p := req.Req.URL.Path
		q := req.Req.URL.RawQuery
		n, _ := strconv.Atoi(req.Req.URL.Query().Get("n"))
		body := stressBody(p+"?"+q+":"+string(req.Body), n)
		switch {
		case strings.HasPrefix(p, "/chunk"):
			w.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			for len(body) > 0 {
				k := min(len(body), 1+rand.Intn(5000))
				fmt.Fprintf(w, "%x\r\n%s\r\n", k, body[:k])
				body = body[k:]
				if rand.Intn(4) == 0 {
					w.Flush()
				}
			}
			w.WriteString("0\r\n\r\n")
		case strings.HasPrefix(p, "/c/"):
			w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=1, stale-while-revalidate=30\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
		default:
			head := "HTTP/1.1 200 OK\r\nX-Echo: " + p + "\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
			if rand.Intn(3) == 0 {
				// The head in two reads: the loop holds its first part.
				cut := rand.Intn(len(head))
				w.WriteString(head[:cut])
				w.Flush()
				time.Sleep(time.Millisecond)
				head = head[cut:]
			}
			w.WriteString(head + body)
		}
	})
	addr, srv := serve(t, loop.Options{Upstream: up.URL(), Loops: 2, Core: configCore(t, stressRules)})
	var wg sync.WaitGroup
	dur := 4 * time.Second
	if d, err := time.ParseDuration(envOr("STRESS_DUR", "")); err == nil {
		dur = d
	}
	stop := time.Now().Add(dur)
	for g := range 24 {
		wg.Go(func() {
			rnd := rand.New(rand.NewSource(int64(g)))
			for time.Now().Before(stop) {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Error(err)
					return
				}
				c.SetDeadline(time.Now().Add(20 * time.Second))
				br := bufio.NewReaderSize(c, 512)
				k := 1 + rnd.Intn(8)
				type exp struct{ method, body string }
				var exps []exp
				var reqs strings.Builder
				for i := range k {
					n := []int{0, 10, 3000, 70000, 300000}[rnd.Intn(5)]
					kind := rnd.Intn(5)
					tag := fmt.Sprintf("g%di%dr%d", g, i, rnd.Intn(1000))
					switch kind {
					case 0:
						path := "/chunk/" + tag
						reqs.WriteString("GET " + path + "?n=" + strconv.Itoa(n) + " HTTP/1.1\r\nHost: a\r\nX-Pad: " + strings.Repeat("p", rnd.Intn(2000)) + "\r\n\r\n")
						exps = append(exps, exp{"GET", stressBody(path+"?n="+strconv.Itoa(n)+":", n)})
					case 1:
						path := "/c/" + strconv.Itoa(rnd.Intn(5))
						nn := []int{10, 3000, 70000}[rnd.Intn(3)]
						reqs.WriteString("GET " + path + "?n=" + strconv.Itoa(nn) + " HTTP/1.1\r\nHost: a\r\n\r\n")
						exps = append(exps, exp{"GET", stressBody(path+"?n="+strconv.Itoa(nn)+":", nn)})
					case 2:
						pb := stressBody(tag, rnd.Intn(100000))
						path := "/post/" + tag
						reqs.WriteString("POST " + path + "?n=" + strconv.Itoa(n) + " HTTP/1.1\r\nHost: a\r\nContent-Length: " + strconv.Itoa(len(pb)) + "\r\n\r\n" + pb)
						exps = append(exps, exp{"POST", stressBody(path+"?n="+strconv.Itoa(n)+":"+pb, n)})
					case 3:
						key := rnd.Intn(12)
						pb := stressBody("k"+strconv.Itoa(key), key*300)
						nk := []int{0, 10, 3000}[key%3]
						path := "/orders"
						reqs.WriteString("POST " + path + "?n=" + strconv.Itoa(nk) + " HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"key" + strconv.Itoa(key) + "\"\r\nContent-Length: " + strconv.Itoa(len(pb)) + "\r\n\r\n" + pb)
						exps = append(exps, exp{"POST", stressBody(path+"?n="+strconv.Itoa(nk)+":"+pb, nk)})
					default:
						pb := stressBody(tag, rnd.Intn(20000))
						path := "/tepost/" + tag
						var cb strings.Builder
						for s := pb; len(s) > 0; {
							m := min(len(s), 1+rnd.Intn(4000))
							fmt.Fprintf(&cb, "%x\r\n%s\r\n", m, s[:m])
							s = s[m:]
						}
						cb.WriteString("0\r\n\r\n")
						reqs.WriteString("POST " + path + "?n=" + strconv.Itoa(n) + " HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + cb.String())
						exps = append(exps, exp{"POST", stressBody(path+"?n="+strconv.Itoa(n)+":"+pb, n)})
					}
				}
				wseed := rnd.Int63()
				go func() {
					rnd := rand.New(rand.NewSource(wseed))
					s := reqs.String()
					for len(s) > 0 {
						m := min(len(s), 1+rnd.Intn(70000))
						if _, err := io.WriteString(c, s[:m]); err != nil {
							return
						}
						s = s[m:]
					}
				}()
				slow := rnd.Intn(3) == 0
				abort := -1
				if rnd.Intn(3) == 0 {
					abort = rnd.Intn(len(exps))
					if rnd.Intn(2) == 0 {
						c.(*net.TCPConn).SetLinger(0)
					}
				}
				for i, e := range exps {
					if i == abort {
						if rnd.Intn(2) == 0 {
							c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
							io.CopyN(io.Discard, br, int64(rnd.Intn(5000)))
						}
						break
					}
					if slow {
						time.Sleep(time.Duration(rnd.Intn(30)) * time.Millisecond)
					}
					resp, err := http.ReadResponse(br, &http.Request{Method: e.method})
					if err != nil {
						t.Errorf("g%d req %d: %v", g, i, err)
						c.Close()
						return
					}
					b, err := io.ReadAll(resp.Body)
					if err != nil {
						t.Errorf("g%d req %d body: %v", g, i, err)
						c.Close()
						return
					}
					if resp.StatusCode == 409 || resp.StatusCode == 429 {
						continue
					}
					if resp.StatusCode != 200 && resp.StatusCode != 201 {
						t.Errorf("g%d req %d: status %d %q", g, i, resp.StatusCode, b)
						continue
					}
					if string(b) != e.body {
						j := 0
						for j < len(b) && j < len(e.body) && b[j] == e.body[j] {
							j++
						}
						t.Errorf("g%d req %d: body differs at %d of %d/%d: got %q want %q", g, i, j, len(b), len(e.body), snip(b, j), snip([]byte(e.body), j))
					}
				}
				c.Close()
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for srv.Stats().Open != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if open := srv.Stats().Open; open != 0 {
		t.Errorf("%d connections open after all clients closed", open)
	}
}

func snip(b []byte, j int) string {
	return string(b[max(0, j-20):min(len(b), j+40)])
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}
