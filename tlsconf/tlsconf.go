package tlsconf

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
)

// Key is a private key in PEM. It prints as "xxxxx" (fmt, and slog through
// LogValue), so that options or a configuration printed by mistake do not
// show it; its JSON is its bytes (a configuration travels to the workers
// as JSON, in memory).
type Key []byte

// String is "xxxxx", or "" for no key.
func (k Key) String() string {
	if len(k) == 0 {
		return ""
	}
	return "xxxxx"
}

// GoString is String quoted: %#v does not show the key either.
func (k Key) GoString() string { return fmt.Sprintf("%q", k.String()) }

// LogValue is String.
func (k Key) LogValue() slog.Value { return slog.StringValue(k.String()) }

// Pair is one certificate: its chain (leaf first) and its private key,
// both PEM.
type Pair struct {
	Cert []byte
	Key  Key
}

// Parse checks a pair: a certificate chain and the private key of its
// leaf.
func Parse(p Pair) (tls.Certificate, error) {
	c, err := tls.X509KeyPair(p.Cert, p.Key)
	if err != nil {
		return c, fmt.Errorf("tlsconf: %w", err)
	}
	if c.Leaf == nil {
		return c, errors.New("tlsconf: no certificate in the chain")
	}
	return c, nil
}

// Options configures a TLS listener. The zero value has no certificate,
// which Config refuses.
type Options struct {
	// Certificates are served: the first to a client whose SNI names
	// none of the others (or that sends none), another to a client whose
	// SNI one of its names covers (wildcards as TLS has them). At least
	// one.
	Certificates []Pair
	// MinVersion is the least TLS version: tls.VersionTLS12 or
	// tls.VersionTLS13. 0 means TLS 1.2.
	MinVersion uint16
	// HTTP2 offers h2 by ALPN, before http/1.1.
	HTTP2 bool
	// Tickets are the session ticket keys' secret, shared by every
	// process serving the listener. The zero value: each process draws
	// its own (sessions resume only on the same process).
	Tickets Tickets
}

// Config builds the tls.Config of a listener. The session ticket keys are
// those of now; Rotate keeps them current.
func (o Options) Config() (*tls.Config, error) {
	if len(o.Certificates) == 0 {
		return nil, errors.New("tlsconf: no certificate")
	}
	cfg := &tls.Config{MinVersion: o.MinVersion, NextProtos: []string{"http/1.1"}}
	switch o.MinVersion {
	case 0:
		cfg.MinVersion = tls.VersionTLS12
	case tls.VersionTLS12, tls.VersionTLS13:
	default:
		return nil, fmt.Errorf("tlsconf: MinVersion %#x: want TLS 1.2 or 1.3", o.MinVersion)
	}
	if o.HTTP2 {
		cfg.NextProtos = []string{"h2", "http/1.1"}
	}
	for i, p := range o.Certificates {
		c, err := Parse(p)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", i+1, err)
		}
		cfg.Certificates = append(cfg.Certificates, c)
	}
	if certs := cfg.Certificates; len(certs) > 1 {
		// crypto/tls alone serves the first certificate the client's
		// hello supports: a default that covers a name (a wildcard)
		// would take it from the certificate listed for it.
		cfg.GetCertificate = func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return choose(certs, hello), nil
		}
	}
	if !o.Tickets.IsZero() {
		cfg.SetSessionTicketKeys(o.Tickets.Keys(timeNow()))
	}
	return cfg, nil
}

// choose is the certificate for hello: one of those after the first whose
// names cover its SNI, a name before a wildcard, else what crypto/tls
// chooses (the first one hello supports, else the first).
func choose(certs []tls.Certificate, hello *tls.ClientHelloInfo) *tls.Certificate {
	if name := strings.ToLower(strings.TrimSuffix(hello.ServerName, ".")); name != "" {
		_, parent, _ := strings.Cut(name, ".")
		for _, wild := range []bool{false, true} {
			want := name
			if wild {
				want = "*." + parent
			}
			for i := 1; i < len(certs); i++ {
				c := &certs[i]
				if c.Leaf != nil && slices.ContainsFunc(c.Leaf.DNSNames, func(n string) bool { return strings.EqualFold(n, want) }) &&
					hello.SupportsCertificate(c) == nil {
					return c
				}
			}
		}
	}
	for i := range certs {
		if hello.SupportsCertificate(&certs[i]) == nil {
			return &certs[i]
		}
	}
	return &certs[0]
}
