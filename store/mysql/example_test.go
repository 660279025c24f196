package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// A store on a MySQL or MariaDB database, migrated at startup, swept once a minute.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	st, err := mysql.New(db, mysql.WithTable("idemkey_records"))
	if err != nil {
		log.Fatal(err) // a bad option
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	defer st.StartSweeper(ctx, time.Minute)()
	_ = st // hand it to the middleware as its store.Store
}

// A handler that writes its own row completes the idempotency record in the same
// transaction: both commit, or neither.
func ExampleStore_CompleteTx() {
	complete := func(ctx context.Context, db *sql.DB, st *mysql.Store, id store.ID, token store.Token) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "INSERT INTO charges (id, cents) VALUES (?, ?)", id.Key, 1200); err != nil {
			return err
		}
		// store.ErrLeaseLost: a retry took the key over; the charge rolls back.
		if err := st.CompleteTx(ctx, tx, id, token, store.Response{Status: 201, Body: []byte(`{"cents":1200}`)}, 24*time.Hour); err != nil {
			return err
		}
		return tx.Commit() // then claim.MarkCompleted(ctx, resp)
	}
	_ = complete
	fmt.Println(mysql.DefaultTable)
	// Output: idemkey_records
}
