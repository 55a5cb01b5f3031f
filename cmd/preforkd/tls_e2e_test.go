//go:build linux

package main

// End-to-end tests of TLS and HTTP/2 toward clients (README "TLS and
// HTTP/2"): the built daemon with [tls], certificates made by the test.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/preforkd/preforkd/internal/tlstest"
)

// tlsDaemon is a daemon serving TLS with two certificates, a.example (the
// default) and b.example, made by ca in dir.
type tlsDaemon struct {
	*daemon
	ca          *tlstest.CA
	dir         string
	aCert, aKey string
	bCert, bKey string
}

func startTLSDaemon(t *testing.T, workers int, extra string) *tlsDaemon {
	t.Helper()
	td := &tlsDaemon{ca: tlstest.NewCA(t), dir: t.TempDir()}
	td.aCert, td.aKey = td.ca.Files(t, td.dir, "a", "a.example")
	td.bCert, td.bKey = td.ca.Files(t, td.dir, "b", "b.example", "*.b.example")
	cfg := baseServer(workers, "") + extra + fmt.Sprintf(`
[tls]
[[tls.certificate]]
cert = %q
key = %q
[[tls.certificate]]
cert = %q
key = %q
`, td.aCert, td.aKey, td.bCert, td.bKey)
	td.daemon = startDaemon(t, daemonOptions{config: noCanary(cfg)})
	return td
}

// dial opens a TLS connection with SNI name, verifying the certificate
// against the test's authority.
func (td *tlsDaemon) dial(t *testing.T, name string, conf *tls.Config) *tls.Conn {
	t.Helper()
	if conf == nil {
		conf = &tls.Config{}
	}
	conf = conf.Clone()
	conf.ServerName, conf.RootCAs = name, td.ca.Pool
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", td.addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// served is the serial of the leaf certificate a connection with SNI name
// gets.
func (td *tlsDaemon) served(t *testing.T, name string) (cn, serial string) {
	t.Helper()
	c := td.dial(t, name, &tls.Config{InsecureSkipVerify: true})
	defer c.Close()
	leaf := c.ConnectionState().PeerCertificates[0]
	return leaf.Subject.CommonName, leaf.SerialNumber.String()
}

// Two certificates chosen by SNI; a renewed certificate is served after
// HUP; a broken one is refused, logged, and the old one kept.
func TestTLSCertificatesE2E(t *testing.T) {
	t.Parallel()
	td := startTLSDaemon(t, 2, "")
	for _, tc := range []struct{ sni, want string }{
		{"a.example", "a.example"}, {"b.example", "b.example"}, {"api.b.example", "b.example"}, {"other.example", "a.example"},
	} {
		if cn, _ := td.served(t, tc.sni); cn != tc.want {
			t.Errorf("SNI %q: served %q, want %q", tc.sni, cn, tc.want)
		}
	}
	_, before := td.served(t, "b.example")

	// Renewed in place: the next handshakes after the reload get it.
	renewed, key := td.ca.Leaf(t, "b.example", "*.b.example")
	os.WriteFile(td.bCert, renewed, 0o644)
	os.WriteFile(td.bKey, key, 0o600)
	from := d0(td).logs.len()
	td.signal(syscall.SIGHUP)
	waitReloaded(t, td.daemon, from, 20*time.Second)
	// An old worker accepts until its TERM is handled: the renewed
	// certificate is served once the old workers stopped accepting.
	after := before
	for deadline := time.Now().Add(10 * time.Second); after == before && time.Now().Before(deadline); {
		if _, after = td.served(t, "b.example"); after == before {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if after == before {
		t.Fatalf("after HUP: serial %s still served, want the renewed certificate", after)
	}

	// Broken: the old certificate is kept, and the log says why.
	os.WriteFile(td.bCert, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"), 0o644)
	from = td.logs.len()
	td.signal(syscall.SIGHUP)
	waitReloaded(t, td.daemon, from, 20*time.Second)
	if _, l, ok := td.logs.waitFor(from, 0, msgIs("reload: a TLS certificate could not be used: the running one is kept")); !ok ||
		!strings.Contains(l.get("err"), "tls.certificate[2]") {
		t.Errorf("no line about the broken certificate (%q)", l.raw)
	} else if n := strings.Count(l.raw, "kept"); n != 1 {
		t.Errorf("the line about the broken certificate says %d times that it is kept, want once: %q", n, l.raw)
	}
	if cn, serial := td.served(t, "b.example"); cn != "b.example" || serial != after {
		t.Errorf("after a broken file: served %s serial %s, want the running b.example (%s)", cn, serial, after)
	}
	// And check refuses it, at its line.
	code, _, stderr := runBinary(t, "check", "-config", td.cfgPath)
	if code != 2 || !strings.Contains(stderr, "tls.certificate[2].cert") {
		t.Errorf("check of the broken file: %d %q", code, stderr)
	}
	td.stop()
}

func d0(td *tlsDaemon) *daemon { return td.daemon }

// A client resumes its session on 12 reconnects across the workers: the
// ticket keys are the supervisor's, shared by every worker.
func TestTLSResumptionAcrossWorkers(t *testing.T) {
	t.Parallel()
	td := startTLSDaemon(t, 4, "")
	for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		conf := &tls.Config{ClientSessionCache: tls.NewLRUClientSessionCache(4), MaxVersion: version, NextProtos: []string{"http/1.1"}}
		workers := map[int]int{} // worker index → resumed connections it served
		resumed := 0
		for i := 0; i < 13 || len(workers) < 2 && i < 60; i++ {
			c := td.dial(t, "a.example", conf)
			fmt.Fprintf(c, "GET /r%d HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n", i)
			b, _ := io.ReadAll(c)
			c.Close()
			_, body, _ := bytes.Cut(b, []byte("\r\n\r\n"))
			var demo demoBody
			if err := json.Unmarshal(body, &demo); err != nil {
				t.Fatalf("connection %d: %q", i, b)
			}
			if i == 0 {
				if c.ConnectionState().DidResume {
					t.Fatal("the first connection resumed")
				}
				continue
			}
			if !c.ConnectionState().DidResume {
				t.Errorf("TLS %#x: reconnect %d (worker %d) did not resume", version, i, demo.Worker)
				continue
			}
			resumed++
			workers[demo.Worker]++
		}
		if resumed < 12 || len(workers) < 2 {
			t.Errorf("TLS %#x: %d reconnects resumed, on workers %v; want 12 on 2 or more workers", version, resumed, workers)
		}
	}
}

// curl --http2 negotiates h2; h2load -n 10 -c 1 -m 10 on a limit of 3:
// every stream is a request to the rules, 3 × 200 and 7 × 429.
func TestHTTP2E2E(t *testing.T) {
	t.Parallel()
	curl := needTool(t, "curl", "curl")
	h2load := needTool(t, "h2load", "nghttp2-client")
	access := filepath.Join(t.TempDir(), "access.log")
	td := startTLSDaemon(t, 2, rule("three", "/limited", "gcra", 3, "1h")+fmt.Sprintf("\n[log]\naccess = %q\naccess_format = \"json\"\n", access))
	caFile := filepath.Join(td.dir, "ca.pem")
	os.WriteFile(caFile, td.ca.PEM, 0o644)
	_, port, _ := net.SplitHostPort(td.addr)
	out, err := exec.Command(curl, "-sS", "--http2", "--cacert", caFile, "--resolve", "a.example:"+port+":127.0.0.1",
		"-o", "/dev/null", "-w", "%{http_version} %{http_code}", "https://a.example:"+port+"/h2").CombinedOutput()
	if err != nil || string(out) != "2 200" {
		t.Errorf("curl --http2: %q %v, want \"2 200\"", out, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err = exec.CommandContext(ctx, h2load, "-n", "10", "-c", "1", "-m", "10", "https://"+td.addr+"/limited").CombinedOutput()
	if err != nil {
		t.Fatalf("h2load: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx`).FindStringSubmatch(string(out))
	if m == nil || !strings.Contains(string(out), "Application protocol: h2") {
		t.Fatalf("h2load's output:\n%s", out)
	}
	if m[1] != "3" || m[3] != "7" {
		t.Errorf("h2load -n 10 -c 1 -m 10 on a limit of 3: %s 2xx, %s 4xx; want 3 and 7\n%s", m[1], m[3], out)
	}
	td.stop()
	// The access log has every stream, as HTTP/2.0, the 429s with their
	// rule.
	var h2, refused int
	for _, l := range accessLines(t, access, 11, time.Second) {
		var e struct {
			Protocol, Target string
			Status           int
			Rule             *string
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		if e.Protocol == "HTTP/2.0" && e.Target == "/limited" {
			h2++
			if e.Status == 429 && e.Rule != nil && *e.Rule == "three" {
				refused++
			}
		}
	}
	if h2 != 10 || refused != 7 {
		t.Errorf("access log: %d HTTP/2 lines of /limited, %d refused by three; want 10 and 7", h2, refused)
	}
}

// workerUsage sums the CPU time (clock ticks) of the daemon's live
// workers and returns the largest resident memory (KiB) among them.
func workerUsage(t *testing.T, d *daemon) (ticks int64, rssKiB int64) {
	t.Helper()
	for _, pid := range d.workerPIDs() {
		if !d.alive(pid) {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(status); m != nil {
			if kb, _ := strconv.ParseInt(string(m[1]), 10, 64); kb > rssKiB {
				rssKiB = kb
			}
		}
	}
	return ticks, rssKiB
}

// floodConn is an HTTP/2 client connection that writes frames by hand.
type floodConn struct {
	c  *tls.Conn
	fr *http2.Framer
}

func (td *tlsDaemon) h2(t *testing.T) *floodConn {
	t.Helper()
	c := td.dial(t, "a.example", &tls.Config{NextProtos: []string{"h2"}})
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("ALPN %q", p)
	}
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	go io.Copy(io.Discard, c) // the server's frames: read, so that it never blocks on them
	return &floodConn{c: c, fr: fr}
}

// headerBlock encodes a GET of path.
func headerBlock(enc *hpack.Encoder, buf *bytes.Buffer, path string, extra ...hpack.HeaderField) []byte {
	buf.Reset()
	for _, f := range append([]hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: "a.example"}, {Name: ":path", Value: path}}, extra...) {
		enc.WriteField(f)
	}
	return buf.Bytes()
}

// flood writes frames with write until the server cuts the connection
// off (a write fails) or max frames were written; it returns how many.
func flood(t *testing.T, fc *floodConn, max int, write func(i int) error) int {
	t.Helper()
	fc.c.SetWriteDeadline(time.Now().Add(20 * time.Second))
	for i := range max {
		if err := write(i); err != nil {
			return i
		}
	}
	return max
}

// Each HTTP/2 flood is cut off within bounded work: the client's
// connection is closed after a bounded number of frames, the workers'
// CPU time and memory stay bounded, and the daemon serves on.
func TestHTTP2FloodsE2E(t *testing.T) {
	t.Parallel()
	td := startTLSDaemon(t, 2, "")
	const frames = 200000
	for _, tc := range []struct {
		name string
		why  string
		run  func(fc *floodConn) int
	}{
		{"rapid reset", "rapid reset", func(fc *floodConn) int {
			var buf bytes.Buffer
			enc := hpack.NewEncoder(&buf)
			return flood(t, fc, frames, func(i int) error {
				id := uint32(2*i + 1)
				if err := fc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headerBlock(enc, &buf, "/reset"),
					EndStream: true, EndHeaders: true}); err != nil {
					return err
				}
				return fc.fr.WriteRSTStream(id, http2.ErrCodeCancel)
			})
		}},
		{"CONTINUATION flood", "CONTINUATION", func(fc *floodConn) int {
			var buf bytes.Buffer
			enc := hpack.NewEncoder(&buf)
			if err := fc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: headerBlock(enc, &buf, "/cont"),
				EndStream: true}); err != nil {
				t.Fatal(err)
			}
			return flood(t, fc, frames, func(int) error { return fc.fr.WriteContinuation(1, false, nil) })
		}},
		{"HPACK bomb", "HPACK bomb", func(fc *floodConn) int {
			var buf bytes.Buffer
			enc := hpack.NewEncoder(&buf)
			big := strings.Repeat("x", 4000)
			// One large entry in the dynamic table, then blocks that name
			// it again and again: a few bytes each, 4 KB decoded.
			return flood(t, fc, frames/100, func(i int) error {
				buf.Reset()
				for _, f := range []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "https"},
					{Name: ":authority", Value: "a.example"}, {Name: ":path", Value: "/bomb"}} {
					enc.WriteField(f)
				}
				for range 1000 {
					enc.WriteField(hpack.HeaderField{Name: "x-bomb", Value: big})
				}
				return fc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: buf.Bytes(),
					EndStream: true, EndHeaders: true})
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ticks0, _ := workerUsage(t, td.daemon)
			from := td.logs.len()
			fc := td.h2(t)
			sent := tc.run(fc)
			fc.c.Close()
			ticks, rss := workerUsage(t, td.daemon)
			if _, l, ok := td.logs.waitFor(from, 5*time.Second, msgIs("HTTP/2 client cut off")); !ok || !strings.Contains(l.get("why"), tc.why) {
				t.Fatalf("no cut-off line for %s (%q); %d frames sent; log:\n%s", tc.name, l.raw, sent, td.logs.text())
			}
			// Cut off long before the client was done, in little CPU
			// time (clock ticks of 10ms) and memory.
			t.Logf("%s: %d of %d frames written before the cut; workers' CPU %d ticks; largest RSS %d KiB", tc.name, sent, frames, ticks-ticks0, rss)
			if sent >= frames/100 && tc.name == "HPACK bomb" || sent >= frames && tc.name != "HPACK bomb" {
				t.Errorf("%s: the client wrote all its frames: never cut off", tc.name)
			}
			if ticks-ticks0 > 300 || rss > 200<<10 {
				t.Errorf("%s: the workers used %d ticks of CPU and up to %d KiB: not bounded", tc.name, ticks-ticks0, rss)
			}
			// The daemon serves on.
			c := td.dial(t, "a.example", &tls.Config{NextProtos: []string{"http/1.1"}})
			io.WriteString(c, "GET /after HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n")
			resp, err := http.ReadResponse(bufioReader(c), nil)
			if err != nil || resp.StatusCode != 200 {
				t.Errorf("after the flood: %v %v", resp, err)
			}
			c.Close()
		})
	}
}

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }
