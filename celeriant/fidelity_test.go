package celeriant_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/celeriant"
	"github.com/idemkey/idemkey/celeriant/celeriantsim"
	"github.com/idemkey/idemkey/celeriant/internal/wire"
)

// The vectors of docs/celeriant-protocol.md section 8.3 leave fields nil or equal to their neighbours,
// so a swap of two of them would go unnoticed. These tests set every field to a distinct
// value and pin the order of the Rust structs (celeriant-db e7c6df9:
// celeriant_msg/src/request/read_filters.rs, request/requests.rs,
// response/responses.rs).

func TestReadFiltersFieldOrder(t *testing.T) {
	u := celeriant.Uint64
	req := celeriant.ReadRequest{Key: goldenKey, Filters: celeriant.ReadFilters{
		FromVersion: 1, ToVersion: u(2), EventTypes: []uint64{3},
		ExcludeClientID: rep(0x04), IncludeClientID: rep(0x05), ExcludeUserID: rep(0x06), IncludeUserID: rep(0x07),
		MinServerTimestamp: u(8), MaxServerTimestamp: u(9), MinClientSeq: u(10), MaxClientSeq: u(11),
		MinEventTimestamp: u(12), MaxEventTimestamp: u(13), MinEventSeq: u(14), MaxEventSeq: u(15),
	}}
	want := hx(t, "93 c0 93 B(11) B(22) B(33) 9f 01 02 91 03 B(04) B(05) B(06) B(07) 08 09 0a 0b 0c 0d 0e 0f")
	got := wire.NewEncoder().ReadRequest(&req)[wire.HeaderSize:]
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
	back, err := wire.NewDecoder().ReadRequest(want)
	if err != nil {
		t.Fatal(err)
	}
	assertEqual(t, back, req)
}

func TestWriteRequestFieldOrder(t *testing.T) {
	req := celeriant.WriteRequest{CorrelationID: rep(0x66), ClientID: rep(0x44), UserID: rep(0x77), Writes: []celeriant.AggregateWrite{{
		Key: goldenKey,
		Events: []celeriant.Event{{ClientSeq: 1, EventSeq: 2, EventID: rep(0x55), Timestamp: 3, TypeMajor: 4, TypeMinor: 5,
			Value: []byte{6}, IV: bytes.Repeat([]byte{7}, 12)}},
		AllowCreate: false, ExpectedVersion: celeriant.Version(8), EnforceClientIdempotency: true,
	}}}
	want := hx(t, "94 B(66) B(44) B(77) 81 93 B(11) B(22) B(33) 94 91 98 01 02 B(55) 03 04 05 c4 01 06 c4 0c 07 07 07 07 07 07 07 07 07 07 07 07 c2 08 c3")
	got := wire.NewEncoder().WriteRequest(&req)[wire.HeaderSize:]
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
	back, err := wire.NewDecoder().WriteRequest(want)
	if err != nil {
		t.Fatal(err)
	}
	assertEqual(t, back, req)
	// Without an expected version and event id: nil, not 0.
	req.Writes[0].ExpectedVersion, req.Writes[0].Events[0].EventID = nil, uuid.Nil
	got = wire.NewEncoder().WriteRequest(&req)[wire.HeaderSize:]
	want = bytes.Replace(want, hx(t, "02 B(55) 03"), hx(t, "02 c0 03"), 1)
	want = bytes.Replace(want, hx(t, "c2 08 c3"), hx(t, "c2 c0 c3"), 1)
	if !bytes.Equal(got, want) {
		t.Fatalf("nil fields: got  %x\nwant %x", got, want)
	}
}

func TestAggregateDetailsResponseFieldOrder(t *testing.T) {
	body := hx(t, "9a B(66) 01 02 03 c3 c2 c3 04 B(44) B(77)")
	d, err := wire.NewDecoder().AggregateDetailsResponse(body)
	if err != nil {
		t.Fatal(err)
	}
	want := celeriant.AggregateDetails{CorrelationID: rep(0x66), MinVersion: 1, MaxVersion: 2, MaxEventSeq: 3,
		IsDeleted: true, AllowRecreate: false, AllowSequenceContinuation: true, LastServerTimestamp: 4,
		LastClientID: rep(0x44), LastUserID: rep(0x77)}
	assertEqual(t, d, want)
	if got := wire.NewEncoder().AggregateDetailsResponse(&want)[wire.HeaderSize:]; !bytes.Equal(got, body) {
		t.Fatalf("encode: %x", got)
	}
}

// TestReadSizeCountsCorrelationID: the client adds a 16-byte correlation id to a read
// that has none, so the 1007-byte check must count it: a read that fits only without
// the id is refused before sending (ErrInvalidRequest) by the client and the simulator
// alike, instead of reaching the server over the limit (which drops the connection).
func TestReadSizeCountsCorrelationID(t *testing.T) {
	_, addr := startSim(t, celeriantsim.Options{})
	c := newClient(t, celeriant.Config{Addrs: []string{addr}})
	key, client := freshKey(), uuid.New()
	if _, err := c.Write(context.Background(), simpleWrite(key, client, 1)); err != nil {
		t.Fatal(err)
	}
	types := func(n int) celeriant.ReadRequest {
		r := celeriant.ReadRequest{Key: key, Filters: celeriant.ReadFilters{FromVersion: 1, EventTypes: make([]uint64, n)}}
		for i := range r.Filters.EventTypes {
			r.Filters.EventTypes[i] = 1
		}
		return r
	}
	enc := wire.NewEncoder()
	withID := func(r celeriant.ReadRequest) int {
		r.CorrelationID = idCorr
		return len(enc.ReadRequest(&r)) - wire.HeaderSize
	}
	fits, over := types(915), types(916)
	if withID(fits) != wire.MaxFixedBody || withID(over) != wire.MaxFixedBody+1 {
		t.Fatalf("sizes %d and %d", withID(fits), withID(over))
	}
	sim := celeriantsim.New(celeriantsim.Options{})
	for name, s := range map[string]celeriant.EventStore{"client": c, "sim": sim} {
		if _, err := s.Read(context.Background(), over); !errors.Is(err, celeriant.ErrInvalidRequest) {
			t.Errorf("%s: a read of %d bytes with its correlation id: %v", name, withID(over), err)
		}
	}
	if res, err := c.Read(context.Background(), fits); err != nil || len(res.Batches) != 1 {
		t.Fatalf("a read of exactly %d bytes: %+v %v", wire.MaxFixedBody, res, err)
	}
}
