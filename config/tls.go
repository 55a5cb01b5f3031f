package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/preforkd/preforkd/internal/smallfile"
	"github.com/preforkd/preforkd/tlsconf"
)

// maxPEMFile bounds a certificate or key file.
const maxPEMFile = 1 << 20

// TLSOptions translates [tls] into the options of the listener's
// tls.Config (package tlsconf); ok is false when TLS is off.
func (c Config) TLSOptions() (o tlsconf.Options, ok bool) {
	t := c.WithDefaults().TLS
	if !t.Enabled() {
		return o, false
	}
	o.HTTP2 = t.HTTP2.IsOn(true)
	o.MinVersion = tls.VersionTLS12
	if t.MinVersion == TLS13 {
		o.MinVersion = tls.VersionTLS13
	}
	for _, cert := range t.Certificates {
		o.Certificates = append(o.Certificates, tlsconf.Pair{Cert: cert.CertPEM, Key: cert.KeyPEM})
	}
	o.Tickets = t.Tickets
	return o, true
}

// check reports what is wrong with [tls], without reading a file;
// listen is server.listen.
func (t TLS) check(r *report, listen string) {
	f := r.at([]string{"tls"}, "tls.")
	if l := t.CleartextListen; l != "" {
		if err := checkAddr(l); err != nil {
			f("cleartext_listen", "%v", err)
		} else if !t.Enabled() {
			f("cleartext_listen", "needs a [[tls.certificate]]: without one, server.listen speaks cleartext itself")
		} else if !anyPort(l) && sameSocket(l, listen) {
			f("cleartext_listen", "%q takes server.listen's port (%q)", l, listen)
		}
	}
	if err := tlsVersionNames.check(t.MinVersion); err != nil {
		f("min_version", "%s", detail(err))
	}
	if err := t.HTTP2.check(); err != nil {
		f("http2", "%s", detail(err))
	}
	if err := cleartextNames.check(t.Cleartext); err != nil {
		f("cleartext", "%s", detail(err))
	}
	if t.RedirectPort < 0 || t.RedirectPort > 65535 {
		f("redirect_port", "must be a port from 1 to 65535, or 0 for server.listen's, got %d", t.RedirectPort)
	}
	if t.TicketRotation < tlsconf.MinRotation || t.TicketRotation > tlsconf.MaxRotation {
		f("ticket_rotation", "must be between %v and %v, got %v", tlsconf.MinRotation, tlsconf.MaxRotation, t.TicketRotation)
	}
	for i, c := range t.Certificates {
		f := r.at([]string{"tls", "certificate", elem(i)}, fmt.Sprintf("tls.certificate[%d].", i+1))
		if c.Cert == "" {
			f("cert", "is required: the PEM file of the certificate chain")
		}
		if c.Key == "" {
			f("key", "is required: the PEM file of the certificate's private key")
		}
	}
}

// readCertificate reads the files of c and checks that they hold a
// chain and the key of its leaf.
func readCertificate(c Certificate) (Certificate, error) {
	var err error
	if c.CertPEM, err = readPEM(c.Cert); err != nil {
		return c, &fileError{"cert", err}
	}
	key, err := readPEM(c.Key)
	if err != nil {
		return c, &fileError{"key", err}
	}
	c.KeyPEM = key
	if err := checkChain(c.CertPEM); err != nil {
		return c, &fileError{"cert", fmt.Errorf("%s: %w", c.Cert, err)}
	}
	if _, err := tlsconf.Parse(tlsconf.Pair{Cert: c.CertPEM, Key: c.KeyPEM}); err != nil {
		return c, &fileError{"key", fmt.Errorf("%s: %s", c.Key, detail(err))}
	}
	return c, nil
}

// fileError is a file that cannot be used, with the key that names it.
type fileError struct {
	key string
	err error
}

func (e *fileError) Error() string { return e.err.Error() }

// checkChain reports whether b starts with a certificate.
func checkChain(b []byte) error {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return errors.New("no PEM certificate in it")
	}
	if _, err := x509.ParseCertificate(block.Bytes); err != nil {
		return err
	}
	return nil
}

func readPEM(path string) ([]byte, error) { return smallfile.Read(path, maxPEMFile, nil) }

// readFiles reads every certificate's files. A certificate that cannot be
// used is reported at its key's line, unless running has one read from
// the same cert file: then that one is kept, and kept says why (a reload
// keeps serving the certificate it had rather than none). Matched by its
// file, not by its place: with a certificate removed or moved before it,
// the one at its place is another site's, which would then be served for
// this one (and as the default), or one the file no longer lists.
func (t *TLS) readFiles(r *report, running *TLS) (kept []error) {
	for i, c := range t.Certificates {
		read, err := readCertificate(c)
		var was *Certificate
		if running != nil {
			for j := range running.Certificates {
				if rc := &running.Certificates[j]; rc.Cert == c.Cert && len(rc.CertPEM) > 0 {
					was = rc
					break
				}
			}
		}
		switch {
		case err == nil:
			t.Certificates[i] = read
		case was != nil:
			t.Certificates[i] = *was
			kept = append(kept, fmt.Errorf("tls.certificate[%d]: %v", i+1, err)) // the caller says it is kept
		default:
			key := "cert"
			var fe *fileError
			if errors.As(err, &fe) {
				key = fe.key
			}
			r.at([]string{"tls", "certificate", elem(i)}, fmt.Sprintf("tls.certificate[%d].", i+1))(key, "%v", err)
		}
	}
	return kept
}
