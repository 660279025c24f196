package postgres_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// ExampleWithPartitions keeps the records in the partitioned layout, whose sweep
// drops whole partitions of past epochs instead of deleting rows: Migrate
// creates the table and the current and next two epochs' partitions, a key is
// claimed, completed and replayed as in the plain layout, and Sweep (here once;
// StartSweeper in a service) creates the partitions ahead and drops the wholly
// expired ones. It needs a server (DATABASE_URL; it uses a schema of its own and
// drops it), so go test compiles it without running it (an example cannot skip);
// TestExampleWithPartitions runs it when DATABASE_URL is set.
func ExampleWithPartitions() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // READ COMMITTED, the default
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "idemkey_example_" + store.NewToken().String()[:8] // yours: a fixed name
	st, err := postgres.New(pool, postgres.WithSchema(schema), postgres.WithTable("idemkey_records_p"),
		postgres.WithPartitions(24*time.Hour)) // at least the longest retention
	if err != nil {
		log.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)

	req := store.ClaimRequest{
		ID:          store.ID{Scope: "customer-42", Key: "order-1"},
		Fingerprint: sha256.Sum256([]byte(`POST /orders {"cents":500}`)),
		Lease:       10 * time.Second,
		Retention:   24 * time.Hour,
	}
	res, err := st.Claim(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	resp := store.Response{Status: 201, Header: http.Header{}, Body: []byte(`{"order":1}`)}
	if err := st.Complete(ctx, req.ID, res.Token, resp, req.Retention); err != nil {
		log.Fatal(err)
	}
	if res, err = st.Claim(ctx, req); err != nil { // a retry
		log.Fatal(err)
	}
	fmt.Println("replay:", res.Outcome == store.Completed, res.Record.Status, string(res.Record.Body))

	dropped, err := st.Sweep(ctx, 0) // nothing has expired yet
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("rows dropped:", dropped)
	// (no Output: it needs a server)
	//   replay: true 201 {"order":1}
	//   rows dropped: 0
}

// TestExampleWithPartitions runs ExampleWithPartitions against DATABASE_URL and
// checks what it prints.
func TestExampleWithPartitions(t *testing.T) {
	runServerExample(t, ExampleWithPartitions, "replay: true 201 {\"order\":1}\nrows dropped: 0\n")
}

// runServerExample runs example, which needs a Postgres server, against
// DATABASE_URL and fails t unless it prints want. Without DATABASE_URL it skips
// (and fails under CI=true): an example with an Output comment cannot skip, so
// go test only compiles these, and this test runs them.
func runServerExample(t *testing.T, example func(), want string) {
	t.Helper()
	testenv.Getenv(t, "DATABASE_URL", "a Postgres server")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = stdout }()
	out := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		out <- b
	}()
	example()
	os.Stdout = stdout
	w.Close()
	if got := <-out; !bytes.Equal(got, []byte(want)) {
		t.Fatalf("the example printed %q, want %q", got, want)
	}
}
