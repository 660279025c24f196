package storetest

import (
	"bytes"
	"errors"
	"testing"

	"github.com/idemkey/idemkey/store"
)

// A completion retried after its reply was lost (it landed) succeeds: the
// record completed by the same token with the same response (status, body,
// omitted mark; headers are not compared: their stored encoding follows map
// order) is left as it is. Another token, or the same token with another
// status or body, is still refused.
func testCompleteAgain(t *testing.T, s *suite) {
	for _, want := range []store.Response{sampleResponse(), {Status: 204}, {Status: 200, BodyOmitted: true}} {
		id := newID(t)
		tok := s.mustClaim(t, req(id, fpA))
		s.complete(t, id, tok, want)
		again := want
		again.Header = want.Header.Clone() // equal, not the same map
		again.Body = bytes.Clone(want.Body)
		if err := s.Store.Complete(s.ctx, id, tok, again, Retention); err != nil && !(s.SealsAnew && errors.Is(err, store.ErrLeaseLost)) {
			t.Errorf("Complete again, same token and response %d: %v, want nil", want.Status, err)
		}
		other := want
		other.Body = append(bytes.Clone(want.Body), 'x')
		other.BodyOmitted = false
		for name, r := range map[string]store.Response{"status": {Status: want.Status + 1, Header: want.Header, Body: want.Body, BodyOmitted: want.BodyOmitted},
			"body": other} {
			if err := s.Store.Complete(s.ctx, id, tok, r, Retention); !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("Complete again, same token, another %s: %v, want ErrLeaseLost", name, err)
			}
		}
		if err := s.Store.Complete(s.ctx, id, store.NewToken(), want, Retention); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Complete with another token: %v, want ErrLeaseLost", err)
		}
		res := s.expect(t, req(id, fpA), store.Completed)
		equalResponse(t, res.Record, want)
	}
}
