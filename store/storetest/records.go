package storetest

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/idemkey/idemkey/store"
)

func testCompleteCopies(t *testing.T, s *suite) {
	// The middleware reuses its buffers once Complete returns (store.Store).
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	resp := sampleResponse()
	want := store.Response{Status: resp.Status, Header: resp.Header.Clone(), Body: bytes.Clone(resp.Body)}
	s.complete(t, id, tok, resp)
	for i := range resp.Body {
		resp.Body[i] = 'X'
	}
	resp.Header["Content-Type"][0] = "text/x-scribbled"
	resp.Header.Set("X-Added", "later")
	res := s.expect(t, req(id, fpA), store.Completed)
	equalResponse(t, res.Record, want)
}

func testRecordUnchanged(t *testing.T, s *suite) {
	// A record handed out is never changed by the store, even when its key expires
	// and is completed again.
	id := newID(t)
	short := 3 * Lease
	r := store.ClaimRequest{ID: id, Fingerprint: fpA, Lease: Lease, Retention: short}
	tok := s.mustClaim(t, r)
	first := store.Response{Status: 201, Header: http.Header{"X-Run": {"1"}}, Body: []byte("first")}
	if err := s.Store.Complete(s.ctx, id, tok, first, short); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	old := s.expect(t, r, store.Completed).Record
	s.Wait(short + slack)
	tok = s.mustClaim(t, r)
	if err := s.Store.Complete(s.ctx, id, tok, store.Response{Status: 202, Header: http.Header{"X-Run": {"2"}}, Body: []byte("again")}, short); err != nil {
		t.Fatalf("second Complete: %v", err)
	}
	equalResponse(t, old, first)
}

func testBodiesRoundTrip(t *testing.T, s *suite) {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	large := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	large[len(large)-1] = 0
	for _, tc := range []struct {
		name string
		body []byte
	}{{"nil", nil}, {"empty", []byte{}}, {"binary", binary}, {"1MiB", large}} {
		t.Run(tc.name, func(t *testing.T) {
			id := newID(t)
			tok := s.mustClaim(t, req(id, fpA))
			resp := store.Response{Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: tc.body}
			s.complete(t, id, tok, resp)
			res := s.expect(t, req(id, fpA), store.Completed)
			if s.MaxBody > 0 && len(tc.body) > s.MaxBody {
				if len(res.Record.Body) != 0 || !res.Record.BodyOmitted {
					t.Fatalf("body of %d bytes over the store's %d: came back as %d bytes, omitted %v; want omitted",
						len(tc.body), s.MaxBody, len(res.Record.Body), res.Record.BodyOmitted)
				}
				return
			}
			if !bytes.Equal(res.Record.Body, tc.body) {
				t.Fatalf("body of %d bytes came back as %d bytes (or changed)", len(tc.body), len(res.Record.Body))
			}
			if res.Record.BodyOmitted {
				t.Error("BodyOmitted set")
			}
		})
	}
}

func testOmittedBody(t *testing.T, s *suite) {
	id := newID(t)
	tok := s.mustClaim(t, req(id, fpA))
	want := store.Response{Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, BodyOmitted: true}
	s.complete(t, id, tok, want)
	res := s.expect(t, req(id, fpA), store.Completed)
	equalResponse(t, res.Record, want)
}
