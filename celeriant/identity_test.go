package celeriant_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

var (
	identityOnce sync.Once
	identityKey  *rsa.PrivateKey
)

// testIdentity is one 2048-bit RSA key for the whole package (generating one costs
// up to a second).
func testIdentity(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	identityOnce.Do(func() {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
		identityKey = k
	})
	return identityKey
}

// signedIdentify is an Identify request for key whose nonce is the Unix time at, in
// milliseconds, signed by signer.
func signedIdentify(t *testing.T, key, signer *rsa.PrivateKey, nonce string) *wire.IdentifyRequest {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte(nonce))
	sig, err := rsa.SignPKCS1v15(nil, signer, crypto.SHA256, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	return &wire.IdentifyRequest{CorrelationID: uuid.New(), PublicKey: base64.StdEncoding.EncodeToString(der),
		Nonce: nonce, Signature: base64.StdEncoding.EncodeToString(sig)}
}

// TestIdentityClientIDIsTheServers: the client id is the first 16 bytes of the
// SHA-256 of the key's DER SubjectPublicKeyInfo read as a little-endian u128, as the
// server derives it: as a decimal u128 (the server's own log form) it equals that
// little-endian reading, and the simulator's Identify answer carries the same id.
func TestIdentityClientIDIsTheServers(t *testing.T) {
	key := testIdentity(t)
	id, err := celeriant.IdentityClientID(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	sum := sha256.Sum256(der)
	le := new(big.Int)
	for i := 15; i >= 0; i-- { // little-endian: byte 15 is the most significant
		le.Lsh(le, 8).Or(le, big.NewInt(int64(sum[i])))
	}
	if got := new(big.Int).SetBytes(id[:]); got.Cmp(le) != 0 {
		t.Fatalf("id %s reads as %s, want the little-endian u128 %s", id, got, le)
	}
	_, addr := startSim(t, celeriantsim.Options{})
	nonce := strconv.FormatInt(time.Now().UnixMilli(), 10)
	h, body := roundTripRaw(t, dialRaw(t, addr), wire.NewEncoder().IdentifyRequest(signedIdentify(t, key, key, nonce)))
	res, err := wire.NewDecoder().IdentifyResponse(body)
	if h.Type != wire.RespIdentify || err != nil || res.ClientID != id {
		t.Fatalf("identify answer %+v, %v; want client id %s", res, err, id)
	}
}

// TestIdentityRules: the simulator checks an RSA identity as the server's source does
// (docs/celeriant-protocol.md section 1.3): the nonce first, accepted from 2 minutes
// old to 60 s ahead of the server's clock (10001 outside, and for a nonce that is not
// a u64), then the signature (10002 for another key's signature, a malformed key or
// signature); an Identify without all three fields is no identity at all. Each case
// is judged on a fresh connection, which the server closes after a refusal.
func TestIdentityRules(t *testing.T) {
	key, other := testIdentity(t), mustKey(t, 1024)
	now := time.UnixMilli(1_800_000_000_000)
	_, addr := startSim(t, celeriantsim.Options{Now: func() time.Time { return now }})
	ms := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).UnixMilli(), 10) }
	const nonceMsg, sigMsg = "Nonce expired or too far in the future", "Invalid signature"
	for _, tc := range []struct {
		name string
		req  *wire.IdentifyRequest
		code celeriant.Code
		msg  string
	}{
		{"now", signedIdentify(t, key, key, ms(0)), 0, ""},
		{"2 minutes old", signedIdentify(t, key, key, ms(-2*time.Minute)), 0, ""},
		{"60 s ahead", signedIdentify(t, key, key, ms(time.Minute)), 0, ""},
		{"plus sign", signedIdentify(t, key, key, "+"+ms(0)), 0, ""},
		{"2 minutes and 1 ms old", signedIdentify(t, key, key, ms(-2*time.Minute-time.Millisecond)), celeriant.CodeIdentifyInvalidNonce, nonceMsg},
		{"60 s and 1 ms ahead", signedIdentify(t, key, key, ms(time.Minute+time.Millisecond)), celeriant.CodeIdentifyInvalidNonce, nonceMsg},
		{"negative", signedIdentify(t, key, key, "-1"), celeriant.CodeIdentifyInvalidNonce, nonceMsg},
		{"seconds, not ms", signedIdentify(t, key, key, strconv.FormatInt(now.Unix(), 10)), celeriant.CodeIdentifyInvalidNonce, nonceMsg},
		{"bad nonce and bad signature", signedIdentify(t, key, other, "x"), celeriant.CodeIdentifyInvalidNonce, nonceMsg},
		{"another key's signature", signedIdentify(t, key, other, ms(0)), celeriant.CodeIdentifyInvalidSignature, sigMsg},
		{"signature of another nonce", func() *wire.IdentifyRequest {
			r := signedIdentify(t, key, key, ms(0))
			r.Nonce = ms(time.Millisecond)
			return r
		}(), celeriant.CodeIdentifyInvalidSignature, sigMsg},
		{"key not DER", func() *wire.IdentifyRequest {
			r := signedIdentify(t, key, key, ms(0))
			r.PublicKey = base64.StdEncoding.EncodeToString([]byte("not a key"))
			return r
		}(), celeriant.CodeIdentifyInvalidSignature, sigMsg},
		{"signature not base64", func() *wire.IdentifyRequest {
			r := signedIdentify(t, key, key, ms(0))
			r.Signature = "!" + r.Signature
			return r
		}(), celeriant.CodeIdentifyInvalidSignature, sigMsg},
		{"no signature: no identity", func() *wire.IdentifyRequest {
			r := signedIdentify(t, key, key, "x")
			r.Signature = ""
			return r
		}(), 0, ""},
	} {
		h, body := roundTripRaw(t, dialRaw(t, addr), wire.NewEncoder().IdentifyRequest(tc.req))
		if tc.code == 0 {
			if h.Type != wire.RespIdentify {
				ef, _ := wire.NewDecoder().ErrorResponse(body)
				t.Errorf("%s: refused %+v, want accepted", tc.name, ef)
			}
			continue
		}
		ef, err := wire.NewDecoder().ErrorResponse(body)
		if h.Type != wire.RespError || err != nil || celeriant.Code(ef.Code) != tc.code || ef.Message != tc.msg {
			t.Errorf("%s: %+v %+v %v; want %d %q", tc.name, h, ef, err, tc.code, tc.msg)
		}
	}
}

func mustKey(t *testing.T, bits int) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestIdentityClient: a client with Config.Identity is identified on every connection,
// also by a server that requires identity (10004 without one); its writes under the
// identity's client id land, a write under another id gets 10003 with the server's
// message before any leader check, and a trim likewise; a client whose clock is 3
// minutes behind the server's gets 10001 before anything is sent (ErrNotSent).
func TestIdentityClient(t *testing.T) {
	ctx := context.Background()
	key := testIdentity(t)
	id, _ := celeriant.IdentityClientID(&key.PublicKey)
	sim, addr := startSim(t, celeriantsim.Options{RequireIdentity: true})
	anon := newClient(t, celeriant.Config{Addrs: []string{addr}})
	if _, err := anon.AggregateDetails(ctx, freshKey()); celeriant.CodeOf(err) != celeriant.CodeIdentifyRequired {
		t.Fatalf("no identity: %v, want 10004", err)
	}
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, Identity: key, APIKey: celeriant.Secret(apiKey(7))})
	k := freshKey()
	if res, err := c.Write(ctx, simpleWrite(k, id, 1)); err != nil || res.Version != 1 {
		t.Fatalf("write under the identity's client id: %+v, %v", res, err)
	}
	stranger := uuid.New()
	_, err := c.Write(ctx, simpleWrite(k, stranger, 2))
	u128 := func(u uuid.UUID) string { return new(big.Int).SetBytes(u[:]).String() }
	wantServerError(t, "write under another client id", err, celeriant.CodeIdentifyMismatch,
		fmt.Sprintf("client_id mismatch: request has %s, connection verified as %s", u128(stranger), u128(id)))
	if errors.Is(err, celeriant.ErrNotSent) || sim.Stats().Writes != 1 {
		t.Fatalf("the refused write: %v, %d writes reached the log", err, sim.Stats().Writes)
	}
	late := newClient(t, celeriant.Config{Addrs: []string{addr}, Identity: key,
		Now: func() time.Time { return time.Now().Add(-3 * time.Minute) }})
	_, err = late.AggregateDetails(ctx, k)
	if !errors.Is(err, celeriant.ErrNotSent) || celeriant.CodeOf(err) != celeriant.CodeIdentifyInvalidNonce {
		t.Fatalf("a clock 3 minutes behind: %v, want ErrNotSent wrapping 10001", err)
	}
}

// TestIdentityKeySize: New refuses an RSA key whose Identify would exceed the
// server's 1007-byte limit for a fixed-size message (the server would drop it).
func TestIdentityKeySize(t *testing.T) {
	if _, err := celeriant.New(celeriant.Config{Addrs: []string{"127.0.0.1:1"}, Identity: testIdentity(t), APIKey: celeriant.Secret(apiKey(7))}); err != nil {
		t.Fatalf("2048-bit key with an API key: %v", err)
	}
	_, err := celeriant.New(celeriant.Config{Addrs: []string{"127.0.0.1:1"}, Identity: mustKey(t, 3072)})
	if err == nil || !strings.Contains(err.Error(), "3072-bit") || !strings.Contains(err.Error(), "1007") {
		t.Fatalf("3072-bit key: %v, want an error naming the key size and the limit", err)
	}
}

// TestLiveRSAIdentity runs the identity path against a real server (CELERIANT_ADDR)
// with an RSA key in CELERIANT_IDENTITY_KEY (a PEM file: PKCS#8 or PKCS#1): a write
// under the identity's client id lands, one under another id gets 10003.
func TestLiveRSAIdentity(t *testing.T) {
	addr, path := os.Getenv("CELERIANT_ADDR"), os.Getenv("CELERIANT_IDENTITY_KEY")
	if addr == "" || path == "" {
		t.Skip("CELERIANT_ADDR and CELERIANT_IDENTITY_KEY not set: skipping the RSA identity suite against a real Celeriant server")
	}
	key, err := celeriant.LoadIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, Identity: key, APIKey: celeriant.Secret(os.Getenv("CELERIANT_API_KEY"))})
	id, _ := celeriant.IdentityClientID(&key.PublicKey)
	k := freshKey()
	if _, err := c.Write(ctx, simpleWrite(k, id, 1)); err != nil {
		t.Fatalf("write under the identity's client id: %v", err)
	}
	if _, err := c.Write(ctx, simpleWrite(k, uuid.New(), 2)); celeriant.CodeOf(err) != celeriant.CodeIdentifyMismatch {
		t.Fatalf("write under another client id: %v, want 10003", err)
	}
}
