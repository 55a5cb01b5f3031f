package tlsconf

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
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
		// With several, crypto/tls serves the first one the client's
		// hello (its SNI, its algorithms) supports, else the first.
		cfg.Certificates = append(cfg.Certificates, c)
	}
	if !o.Tickets.IsZero() {
		cfg.SetSessionTicketKeys(o.Tickets.Keys(timeNow()))
	}
	return cfg, nil
}
