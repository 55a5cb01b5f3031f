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
	if !strings.Contains(b.String(), "tls: min_version=1.2 http2=true ticket_rotation=12h0m0s\n") ||
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
