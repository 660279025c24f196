package inbox_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store/postgres/inbox"
)

// Example applies one message through the inbox: the row of the handler and the
// inbox row commit together, and a redelivery changes nothing. It needs a server
// (DATABASE_URL), so it is compiled but not run by go test.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	in, err := inbox.New(pool) // table idemkey_inbox
	if err != nil {
		log.Fatal(err)
	}
	if err := in.Migrate(ctx); err != nil { // idempotent; run at startup
		log.Fatal(err)
	}

	// The message id is the producer's business key, the same on every delivery.
	outcome, err := in.Process(ctx, "payments-applier", "instr-42", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE balances SET cents = cents + 1200 WHERE account_id = 'acc-1'`)
		return err
	})
	switch {
	case err != nil:
		log.Print("nothing committed; nack so the broker redelivers: ", err)
	case outcome == inbox.AlreadyProcessed:
		log.Print("duplicate; ack without changing anything")
	default:
		log.Print("applied and committed; ack")
	}
}
