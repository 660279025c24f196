package postgres

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
)

// BenchmarkReplay compares, on one completed record, the
// round trip of a replay with that of a plain primary-key SELECT of the same row
// (every column the claim returns): "select" is the SELECT, "readsql" the
// claim's first statement (rowSQL) alone and "claimsql" the claim statement
// alone, both scanned but not decoded, "claim" Store.Claim with WithReadFirst
// (its read and the decoding; the claim statement does not run on a replay),
// "claimdefault" Store.Claim without it (the claim statement), "onetx" the claim batch of the one-transaction mode (BEGIN, the
// key's lock tried, the read; its ROLLBACK is not timed, as it runs after the
// answer), "onetxread" the one-transaction mode with WithReadFirst (the read
// alone, no transaction).
// The seven run interleaved in chunks; each reports its median ns/op over the
// chunks and its ratio to select:
//
//	DATABASE_URL=... go test -run '^$' -bench Replay -benchtime 2000x ./store/postgres/
func BenchmarkReplay(b *testing.B) {
	// Four connections: the ROLLBACK a one-transaction replay sends after its
	// answer holds one, which must not make the next operation wait for it.
	pool := newPool(b, "", func(c *pgxpool.Config) { c.MaxConns = 4 })
	s := newStore(b, pool, nil, WithReadFirst())
	plain, err := New(pool, WithSchema(s.schema), WithTable(s.table))
	if err != nil {
		b.Fatal(err)
	}
	ts, err := plain.OneTx(pool)
	if err != nil {
		b.Fatal(err)
	}
	tsRead, err := s.OneTx(pool)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req := store.ClaimRequest{ID: newID(), Fingerprint: fingerprint("a"), Lease: time.Minute, Retention: time.Hour}
	res, err := s.Claim(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
		Body: []byte(`{"id":1,"amount":100,"currency":"EUR","status":"accepted"}`)}
	if err := s.Complete(ctx, req.ID, res.Token, resp, req.Retention); err != nil {
		b.Fatal(err)
	}
	selectSQL := `SELECT fingerprint, status, headers, body, body_omitted, created_at, completed_at, expires_at, lease_until
FROM ` + s.Table() + ` WHERE scope = $1 AND key = $2`
	args := claimArgs(req, store.NewToken())
	ops := []struct {
		name string
		do   func() error
	}{
		{"select", func() error {
			var r claimRow
			var fp []byte
			var lease pgtype.Timestamptz
			return pool.QueryRow(ctx, selectSQL, args[0], args[1]).Scan(&fp, &r.status, &r.headers, &r.body,
				&r.omitted, &r.created, &r.completed, &r.expires, &lease)
		}},
		{"readsql", func() error {
			var k keyRow
			return pool.QueryRow(ctx, s.readSQL, args[:2]...).Scan(k.dest()...)
		}},
		{"claimsql", func() error {
			var r claimRow
			return r.scan(pool.QueryRow(ctx, s.claimSQL, args...))
		}},
		{"claim", func() error { _, err := s.Claim(ctx, req); return err }},
		{"claimdefault", func() error { _, err := plain.Claim(ctx, req); return err }},
		{"onetx", func() error { _, _, err := ts.ClaimTx(ctx, req); return err }},
		{"onetxread", func() error { _, _, err := tsRead.ClaimTx(ctx, req); return err }},
	}
	const chunk = 50
	per := make([][]float64, len(ops))
	for i := 0; i < b.N; i += chunk {
		for k, op := range ops {
			t0 := time.Now()
			for range chunk {
				if err := op.do(); err != nil {
					b.Fatal(op.name, err)
				}
			}
			per[k] = append(per[k], float64(time.Since(t0).Nanoseconds())/chunk)
		}
	}
	base := median(per[0])
	for k, op := range ops {
		m := median(per[k])
		b.ReportMetric(m, op.name+"-ns/op")
		b.ReportMetric(m/base, op.name+"/select")
	}
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}
