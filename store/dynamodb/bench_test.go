package dynamodb_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/dynamodb/dynamotest"
)

// BenchmarkFirstExecution is a claim of a new key and its completion with a
// 1 KiB response (two requests); BenchmarkReplay a replay of it (one refused
// PutItem and, on dynalite, one GetItem). Against a local server the time is
// mostly the server's; allocs/op is the store's and the SDK's own cost.
func BenchmarkFirstExecution(b *testing.B) {
	c := dynamotest.Client(b, nil)
	s := dynamotest.Store(b, c, dynamotest.Table(b, c))
	resp := benchResponse()
	b.ReportAllocs()
	for b.Loop() {
		id := store.ID{Scope: "tenant-42", Key: store.NewToken().String()}
		res, err := s.Claim(b.Context(), store.ClaimRequest{ID: id, Lease: 10 * time.Second, Retention: time.Hour})
		if err != nil || res.Outcome != store.Claimed {
			b.Fatalf("claim: %+v %v", res, err)
		}
		if err := s.Complete(b.Context(), id, res.Token, resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	c := dynamotest.Client(b, nil)
	s := dynamotest.Store(b, c, dynamotest.Table(b, c))
	r := store.ClaimRequest{ID: store.ID{Scope: "tenant-42", Key: store.NewToken().String()}, Lease: 10 * time.Second, Retention: time.Hour}
	res, err := s.Claim(b.Context(), r)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(b.Context(), r.ID, res.Token, benchResponse(), time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if res, err := s.Claim(b.Context(), r); err != nil || res.Outcome != store.Completed {
			b.Fatalf("replay: %+v %v", res, err)
		}
	}
}

func benchResponse() store.Response {
	body := make([]byte, 1024)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	return store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/42"}}, Body: body}
}
