package celeriant_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
)

// TestTLS runs the client over crypto/tls against the simulator behind a TLS listener,
// with a self-signed certificate for 127.0.0.1 (docs/celeriant-protocol.md section 1.2).
func TestTLS(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "celeriant-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sim := celeriantsim.New(celeriantsim.Options{})
	t.Cleanup(func() { _ = sim.Close() })
	go func() {
		_ = sim.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}))
	}()

	c := newClient(t, celeriant.Config{Addrs: []string{ln.Addr().String()}, TLS: &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}})
	ctx, k := context.Background(), freshKey()
	for seq := uint64(1); seq <= 3; seq++ {
		if _, err := c.Write(ctx, simpleWrite(k, uuid.New(), seq)); err != nil {
			t.Fatal(err)
		}
	}
	d, err := c.AggregateDetails(ctx, k)
	if err != nil || d.MaxVersion != 3 {
		t.Fatalf("details %+v %v", d, err)
	}
	// A client that does not trust the certificate never sends anything.
	bad := newClient(t, celeriant.Config{Addrs: []string{ln.Addr().String()}, TLS: &tls.Config{ServerName: "127.0.0.1"}})
	if _, err := bad.Write(ctx, simpleWrite(k, uuid.New(), 9)); !errors.Is(err, celeriant.ErrNotSent) {
		t.Fatalf("untrusted certificate: %v", err)
	}
	if got := sim.Stats().Writes; got != 3 {
		t.Fatalf("the simulator saw %d writes, want 3", got)
	}
}
