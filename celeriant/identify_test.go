package celeriant_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

func apiKey(b byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, celeriant.APIKeySize))
}

var (
	rwKey, roKey, revokedKey = apiKey(1), apiKey(2), apiKey(3)
	authOpts                 = celeriantsim.Options{RequireIdentity: true,
		APIKeys: map[string]celeriant.AccessLevel{rwKey: celeriant.ReadWrite, roKey: celeriant.ReadOnly}}
)

// wantServerError checks the code and the exact message of err (the server's text).
func wantServerError(t *testing.T, step string, err error, code celeriant.Code, msg string) {
	t.Helper()
	var se *celeriant.ServerError
	if !errors.As(err, &se) || se.Code != code || se.Message != msg {
		t.Fatalf("%s: %v, want %d %q", step, err, code, msg)
	}
}

// TestIdentifyAPIKey: against a server requiring identity with API keys (the
// simulator's RequireIdentity and APIKeys, docs/celeriant-protocol.md section 1.3), a
// client without a key gets 10004; with a read-write key it writes and reads, large
// answers compressed with the dictionary of the handshake; a read-only key reads and
// gets 10007 for a write, on a connection that stays usable; a key the server does not
// have (never issued, or rotated out) is refused with 10006 before any request is sent.
func TestIdentifyAPIKey(t *testing.T) {
	ctx := context.Background()
	_, addr := startSim(t, authOpts)
	key := freshKey()

	anon := newClient(t, celeriant.Config{Addrs: []string{addr}})
	_, err := anon.Write(ctx, simpleWrite(key, uuid.New(), 1))
	wantServerError(t, "no Identify", err, celeriant.CodeIdentifyRequired, "Server requires client identity verification")

	rw := newClient(t, celeriant.Config{Addrs: []string{addr}, APIKey: celeriant.Secret(rwKey)})
	me := uuid.New()
	writeAndReadLarge(t, ctx, rw, key, me)

	ro := newClient(t, celeriant.Config{Addrs: []string{addr}, APIKey: celeriant.Secret(roKey), MaxConns: 1})
	_, err = ro.Write(ctx, simpleWrite(key, me, 4))
	wantServerError(t, "write with a read-only key", err, celeriant.CodeAuthInsufficientPermissions, "Insufficient permissions for this operation")
	if d, err := ro.AggregateDetails(ctx, key); err != nil || d.MaxVersion != 3 {
		t.Fatalf("details with a read-only key on the same connection: %+v, %v", d, err)
	}

	for name, k := range map[string]string{"never issued": apiKey(9), "rotated out": revokedKey} {
		c := newClient(t, celeriant.Config{Addrs: []string{addr}, APIKey: celeriant.Secret(k)})
		_, err := c.AggregateDetails(ctx, key)
		if !errors.Is(err, celeriant.ErrNotSent) {
			t.Fatalf("%s key: %v, want ErrNotSent", name, err)
		}
		wantServerError(t, name+" key", err, celeriant.CodeAuthInvalidKey, "Invalid API key")
	}
}

// TestIdentifyCompressesLargeAnswers: on an identified connection the simulator
// compresses a variable-size answer of 1024 bytes or more (compression byte 1, zstd
// with the dictionary the Identify response carried), as the server does; a smaller
// one, and every answer without Identify, stays plain.
func TestIdentifyCompressesLargeAnswers(t *testing.T) {
	sim, addr := startSim(t, celeriantsim.Options{})
	key := freshKey()
	for seq := uint64(1); seq <= 2; seq++ {
		req := simpleWrite(key, uuid.New(), seq)
		req.Writes[0].Events[0].Value = bytes.Repeat([]byte("x"), 700)
		if _, err := sim.Write(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	read := func(nc net.Conn, to uint64) wire.Header {
		t.Helper()
		f := celeriant.ReadFilters{FromVersion: 1, ToVersion: celeriant.Uint64(to)}
		h, _ := roundTripRaw(t, nc, wire.NewEncoder().ReadRequest(&celeriant.ReadRequest{CorrelationID: uuid.New(), Key: key, Filters: f}))
		return h
	}
	plain := dialRaw(t, addr)
	if h := read(plain, 2); h.Type != wire.RespRead || h.Compression != 0 {
		t.Fatalf("without Identify: %+v", h)
	}
	ided := dialRaw(t, addr)
	h, body := roundTripRaw(t, ided, wire.NewEncoder().IdentifyRequest(&wire.IdentifyRequest{CorrelationID: uuid.New()}))
	res, err := wire.NewDecoder().IdentifyResponse(body)
	if h.Type != wire.RespIdentify || err != nil || len(res.Dict) == 0 || res.DictSHA == "" || res.AccessLevel != 0 {
		t.Fatalf("identify without keys: %+v %+v %v", h, res, err)
	}
	if h := read(ided, 1); h.Compression != 0 {
		t.Fatalf("small answer compressed: %+v", h)
	}
	if h := read(ided, 2); h.Compression != 1 || h.CompressedLength >= h.UncompressedLength {
		t.Fatalf("large answer: %+v, want compressed", h)
	}
}

// TestIdentifyErrors: every refusal of the Identify path with the server's exact
// message (docs/celeriant-protocol.md section 1.3), each closing the connection:
// 10005 without a key, 10006 for a key that is not base64, not 32 bytes, or not
// configured.
func TestIdentifyErrors(t *testing.T) {
	_, addr := startSim(t, authOpts)
	for _, tc := range []struct {
		key  string
		code celeriant.Code
		msg  string
	}{
		{"", celeriant.CodeAuthRequired, "API key required but not provided"},
		{"not base64!", celeriant.CodeAuthInvalidKey, "Invalid API key format"},
		{base64.StdEncoding.EncodeToString(make([]byte, 16)), celeriant.CodeAuthInvalidKey, "Invalid API key length"},
		{revokedKey, celeriant.CodeAuthInvalidKey, "Invalid API key"},
	} {
		nc := dialRaw(t, addr)
		corr := uuid.New()
		h, body := roundTripRaw(t, nc, wire.NewEncoder().IdentifyRequest(&wire.IdentifyRequest{CorrelationID: corr, APIKey: tc.key}))
		ef, err := wire.NewDecoder().ErrorResponse(body)
		if h.Type != wire.RespError || err != nil || celeriant.Code(ef.Code) != tc.code || ef.Message != tc.msg || ef.CorrelationID != corr {
			t.Errorf("key %q: %+v %+v %v; want %d %q", tc.key, h, ef, err, tc.code, tc.msg)
		}
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("key %q: connection after the refusal: %v, want EOF", tc.key, err)
		}
	}
}

// TestAPIKeyNeverShown: the API key appears in no printed or marshalled Config, no
// error (a refused key, a malformed key at New) and no log line of the client.
func TestAPIKeyNeverShown(t *testing.T) {
	_, addr := startSim(t, authOpts)
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, k := range []string{revokedKey, rwKey} {
		cfg := celeriant.Config{Addrs: []string{addr}, APIKey: celeriant.Secret(k), Logger: logger}
		js, _ := json.Marshal(cfg)
		shown := fmt.Sprintf("%v %+v %#v %s %q", cfg, cfg, cfg, cfg.APIKey, cfg.APIKey) + string(js)
		logger.Info("config", "cfg", cfg, "key", cfg.APIKey)
		c := newClient(t, cfg)
		_, err := c.AggregateDetails(context.Background(), freshKey())
		if err != nil {
			shown += err.Error()
		}
		if strings.Contains(shown, k) || strings.Contains(logs.String(), k) {
			t.Fatalf("the key is shown: %s / %s", shown, logs.String())
		}
	}
	bad := "c2VjcmV0LWJ1dC10b28tc2hvcnQ=" // base64, not 32 bytes
	if _, err := celeriant.New(celeriant.Config{Addrs: []string{addr}, APIKey: celeriant.Secret(bad)}); err == nil || strings.Contains(err.Error(), bad) {
		t.Fatalf("New with a malformed key: %v", err)
	}
}

// writeAndReadLarge writes three batches of about 2.5 KB to key as client and reads
// them back: a read answer over 1024 bytes, compressed on an identified connection.
func writeAndReadLarge(t *testing.T, ctx context.Context, s celeriant.EventStore, key celeriant.AggregateKey, client uuid.UUID) {
	t.Helper()
	big := bytes.Repeat([]byte(`{"amountCents":100,"type":"Deposited"} `), 64)
	for seq := uint64(1); seq <= 3; seq++ {
		req := simpleWrite(key, client, seq)
		req.Writes[0].Events[0].Value = big
		if _, err := s.Write(ctx, req); err != nil {
			t.Fatalf("write %d: %v", seq, err)
		}
	}
	batches, err := celeriant.ReadAll(ctx, s, celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{FromVersion: 1}})
	if err != nil || len(batches) != 3 || !bytes.Equal(batches[2].Events[0].Value, big) {
		t.Fatalf("read back: %d batches, %v", len(batches), err)
	}
}

func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

// roundTripRaw writes frame and reads one answer frame.
func roundTripRaw(t *testing.T, nc net.Conn, frame []byte) (wire.Header, []byte) {
	t.Helper()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(frame); err != nil {
		t.Fatal(err)
	}
	h, body, err := wire.ReadFrame(nc, nil, func(wire.Header) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	return h, bytes.Clone(body)
}

// TestLiveIdentity runs the Identify path against a real server started with API keys
// (CELERIANT_ADDR and CELERIANT_API_KEY, a read-write key of that server): the key
// writes and reads back an answer large enough to come compressed; a key the server
// does not have gets 10006, no key 10005, a malformed one its own 10006, each with
// the server's exact message.
func TestLiveIdentity(t *testing.T) {
	addr, key := os.Getenv("CELERIANT_ADDR"), os.Getenv("CELERIANT_API_KEY")
	if addr == "" || key == "" {
		t.Skip("CELERIANT_ADDR and CELERIANT_API_KEY not set: skipping the identity suite against a real Celeriant server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := newClient(t, celeriant.Config{Addrs: []string{addr}, APIKey: celeriant.Secret(key)})
	k := freshKey()
	writeAndReadLarge(t, ctx, c, k, uuid.New())
	other := newClient(t, celeriant.Config{Addrs: []string{addr}, APIKey: celeriant.Secret(apiKey(0xa5))})
	_, err := other.AggregateDetails(ctx, k)
	wantServerError(t, "unknown key", err, celeriant.CodeAuthInvalidKey, "Invalid API key")
	for _, tc := range []struct {
		key  string
		code celeriant.Code
		msg  string
	}{
		{"", celeriant.CodeAuthRequired, "API key required but not provided"},
		{"not base64!", celeriant.CodeAuthInvalidKey, "Invalid API key format"},
		{base64.StdEncoding.EncodeToString(make([]byte, 16)), celeriant.CodeAuthInvalidKey, "Invalid API key length"},
	} {
		h, body := roundTripRaw(t, dialRaw(t, addr), wire.NewEncoder().IdentifyRequest(&wire.IdentifyRequest{CorrelationID: uuid.New(), APIKey: tc.key}))
		ef, err := wire.NewDecoder().ErrorResponse(body)
		if h.Type != wire.RespError || err != nil || celeriant.Code(ef.Code) != tc.code || ef.Message != tc.msg {
			t.Errorf("key %q: %+v %+v %v; want %d %q", tc.key, h, ef, err, tc.code, tc.msg)
		}
	}
}
