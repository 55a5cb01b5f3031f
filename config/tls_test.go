package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/internal/tlstest"
)

// Load reads every certificate and its key; one that cannot be used
// refuses the file at its key's line; a reload keeps the running
// certificate at its place instead, saying why.
func TestLoadTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t)
	aCert, aKey := ca.Files(t, dir, "a", "a.example")
	bCert, bKey := ca.Files(t, dir, "b", "b.example")
	cfgText := func(certs ...string) string {
		s := "[tls]\n"
		for i := 0; i+1 < len(certs); i += 2 {
			s += "[[tls.certificate]]\ncert = \"" + certs[i] + "\"\nkey = \"" + certs[i+1] + "\"\n"
		}
		return s
	}
	path := filepath.Join(dir, "preforkd.toml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(cfgText(aCert, aKey, bCert, bKey))
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := c.TLSOptions()
	if !ok || len(o.Certificates) != 2 || !o.HTTP2 || len(o.Certificates[1].Key) == 0 {
		t.Fatalf("TLS options %v %+v", ok, o)
	}
	var b strings.Builder
	c.WriteEffective(&b)
	if !strings.Contains(b.String(), "tls: min_version=1.2 http2=true ticket_rotation=12h0m0s cleartext_listen=\"\" cleartext=redirect redirect_port=0\n") ||
		!strings.Contains(b.String(), "tls certificate 2: cert="+bCert+" key="+bKey+"\n") || strings.Contains(b.String(), "PRIVATE") {
		t.Errorf("check prints:\n%s", b.String())
	}

	// The key of another certificate: refused at the line of the
	// second certificate's key; at a reload, the running one is kept.
	write(cfgText(aCert, aKey, bCert, aKey))
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), ":7: tls.certificate[2].key") {
		t.Errorf("a mismatched key: %v", err)
	}
	next, kept, err := LoadReload(path, c)
	if err != nil || len(kept) != 1 || !strings.Contains(kept[0].Error(), "tls.certificate[2]") ||
		string(next.TLS.Certificates[1].CertPEM) != string(c.TLS.Certificates[1].CertPEM) {
		t.Errorf("reload with a bad certificate: %v %v", kept, err)
	}
	// A missing file, with no running certificate at its place: refused.
	write(cfgText(aCert, aKey, bCert, bKey, filepath.Join(dir, "missing.crt"), aKey))
	if _, _, err := LoadReload(path, c); err == nil || !strings.Contains(err.Error(), "tls.certificate[3].cert") {
		t.Errorf("a third, missing certificate: %v", err)
	}
	// The running certificate kept is the one read from the same cert
	// file, wherever the file lists it: with a removed (or reordered)
	// one before it, the one at its place is another site's.
	if err := os.Rename(bCert, bCert+".renewing"); err != nil {
		t.Fatal(err)
	}
	write(cfgText(bCert, bKey))
	next, kept, err = LoadReload(path, c)
	if err != nil || len(kept) != 1 || len(next.TLS.Certificates) != 1 ||
		string(next.TLS.Certificates[0].CertPEM) != string(c.TLS.Certificates[1].CertPEM) {
		t.Errorf("reload with b first, its file away: kept %v, err %v; want b's running certificate kept", kept, err)
	}
	// A certificate new to the configuration whose file cannot be used,
	// listed where another one ran: refused, not that other one served.
	write(cfgText(filepath.Join(dir, "missing.crt"), aKey, aCert, aKey))
	if _, _, err := LoadReload(path, c); err == nil || !strings.Contains(err.Error(), "tls.certificate[1].cert") {
		t.Errorf("a new, missing first certificate: %v", err)
	}
	if _, err := Parse([]byte("[[tls.certificate]]\ncert = \"/x\"\n"), "t"); err == nil || !strings.Contains(err.Error(), "key: is required") {
		t.Errorf("no key: %v", err)
	}
	if _, err := Parse([]byte("[tls]\nmin_version = \"1.1\"\n"), "t"); err == nil {
		t.Error("min_version 1.1 accepted")
	}
	if _, err := Parse([]byte("[tls]\nticket_rotation = \"1s\"\n"), "t"); err == nil {
		t.Error("a rotation of 1s accepted")
	}
}

// tls.cleartext_listen is a cleartext port beside the TLS one: only with
// a certificate, never server.listen's address; tls.cleartext says what
// it does.
func TestTLSCleartext(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, key := tlstest.NewCA(t).Files(t, dir, "a", "a.example")
	certs := "[[tls.certificate]]\ncert = \"" + cert + "\"\nkey = \"" + key + "\"\n"
	path := filepath.Join(dir, "preforkd.toml")
	load := func(s string) (Config, error) {
		if err := os.WriteFile(path, []byte("[server]\nlisten = \"127.0.0.1:8443\"\n"+s), 0o600); err != nil {
			t.Fatal(err)
		}
		return Load(path)
	}
	for _, tc := range []struct{ text, err string }{
		{"[tls]\ncleartext_listen = \"127.0.0.1:8080\"\n", ":4: tls.cleartext_listen: needs a [[tls.certificate]]"},
		{"[tls]\ncleartext_listen = \"127.0.0.1:8443\"\n" + certs, ":4: tls.cleartext_listen: \"127.0.0.1:8443\" takes server.listen's port"},
		{"[tls]\ncleartext_listen = \":8443\"\n" + certs, "takes server.listen's port"},
		{"[tls]\ncleartext_listen = \"127.0.0.1\"\n" + certs, ":4: tls.cleartext_listen: invalid address"},
		{"[tls]\ncleartext_listen = \"127.0.0.1:8080\"\ncleartext = \"proxy\"\n" + certs, ":5: tls.cleartext"},
		{"[tls]\ncleartext = \"serve\"\n", ""},
		// admin.listen on the cleartext port: the start would fail to
		// bind the second of them, after check said ok.
		{"[admin]\nlisten = \"127.0.0.1:8080\"\n[tls]\ncleartext_listen = \"127.0.0.1:8080\"\n" + certs, ":4: admin.listen: \"127.0.0.1:8080\" takes tls.cleartext_listen's port"},
		{"[admin]\nlisten = \"localhost:8080\"\n[tls]\ncleartext_listen = \":8080\"\n" + certs, "takes tls.cleartext_listen's port"},
		{"[admin]\nlisten = \"127.0.0.1:0\"\n[tls]\ncleartext_listen = \"127.0.0.1:0\"\n" + certs, ""},
		{"[tls]\ncleartext_listen = \"127.0.0.1:8080\"\nredirect_port = 70000\n" + certs, ":5: tls.redirect_port: must be a port from 1 to 65535"},
		{"[tls]\ncleartext_listen = \"127.0.0.1:8080\"\nredirect_port = -1\n" + certs, "tls.redirect_port"},
		{"[tls]\ncleartext_listen = \"127.0.0.1:8080\"\nredirect_port = 443\n" + certs, ""},
	} {
		_, err := load(tc.text)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %v, want %q", tc.text, err, tc.err)
		}
	}
	c, err := load("[tls]\ncleartext_listen = \"127.0.0.1:8080\"\n" + certs)
	if err != nil {
		t.Fatal(err)
	}
	if l, mode := c.TLS.CleartextListen, c.WithDefaults().TLS.Cleartext; l != "127.0.0.1:8080" || mode != CleartextRedirect || mode.String() != "redirect" {
		t.Errorf("cleartext_listen %q, cleartext %v", l, mode)
	}
	var b strings.Builder
	c.WriteEffective(&b)
	if !strings.Contains(b.String(), "cleartext_listen=127.0.0.1:8080 cleartext=redirect redirect_port=0") ||
		!strings.Contains(b.String(), "server: the cleartext port 127.0.0.1:8080 (tls.cleartext_listen) is served with loop, over the same region: redirect to https\n") {
		t.Errorf("check prints:\n%s", b.String())
	}
}
