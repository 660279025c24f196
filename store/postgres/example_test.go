package postgres_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// Example builds the store on a pgx pool, migrates it, and walks one idempotency
// key through claim, complete and replay. It needs a server (DATABASE_URL), so it is
// compiled but not run by go test.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	st, err := postgres.New(pool, postgres.WithTable("idemkey_records"))
	if err != nil {
		log.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil { // idempotent; run at startup
		log.Fatal(err)
	}
	stop := st.StartSweeper(ctx, time.Minute) // deletes records past retention
	defer stop()

	req := store.ClaimRequest{
		ID:          store.ID{Scope: "customer-42", Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		Fingerprint: sha256.Sum256([]byte("POST /payments {\"amountCents\":500}")),
		Lease:       10 * time.Second,
		Retention:   24 * time.Hour,
	}
	res, err := st.Claim(ctx, req)
	if err != nil {
		log.Fatal(err) // the middleware answers 503
	}
	if res.Outcome == store.Claimed {
		// ... run the handler once, then keep its response:
		resp := store.Response{Status: 201, Header: http.Header{"Location": {"/payments/7"}}, Body: []byte(`{"id":7}`)}
		if err := st.Complete(ctx, req.ID, res.Token, resp, req.Retention); err != nil {
			log.Fatal(err) // store.ErrLeaseLost: another holder took the key over
		}
		res, err = st.Claim(ctx, req) // a retry
		if err != nil {
			log.Fatal(err)
		}
	}
	switch res.Outcome {
	case store.Completed:
		fmt.Println("replay:", res.Record.Status, string(res.Record.Body))
	case store.InFlight:
		fmt.Println("409, retry after", res.RetryAfter) // another request holds the key
	case store.Mismatch:
		fmt.Println("422: the key was used for another request")
	}
}
