package postgres

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkey/idemkey/middleware"
)

// oneTxKillEnv names the schema the one-transaction helper process serves.
const oneTxKillEnv = "IDEMKEY_ONETX_KILL_SCHEMA"

// TestOneTxKillHelperProcess is not a test: it is the server process that
// TestOneTxKillMidHandler starts and kills. Its one-transaction handler inserts
// a row; with X-Kill it then kills its own process with SIGKILL.
func TestOneTxKillHelperProcess(t *testing.T) {
	schema := os.Getenv(oneTxKillEnv)
	if schema == "" {
		t.Skip("helper process of TestOneTxKillMidHandler")
	}
	pool, s := helperStore(t, schema)
	_, m := oneTxMiddleware(t, s, pool, nil)
	side := s.ident("charges")
	h := m.OneTx(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := TxFromContext(r.Context())
		id, _ := middleware.KeyFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+side+` (key) VALUES ($1)`, id.Key); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if r.Header.Get("X-Kill") != "" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		w.WriteHeader(201)
		fmt.Fprintf(w, "charged by pid %d", os.Getpid())
	}))
	serveHelper(t, h)
}

// TestOneTxKillMidHandler kills the serving process with SIGKILL after the
// handler inserted its row, before the commit: the transaction aborts, its lock
// goes, and the retry on a restarted process runs at once (no lease to wait
// for): exactly one row and one record.
func TestOneTxKillMidHandler(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts processes")
	}
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	side := sideTable(t, pool, s, "")
	post := func(url, kill string) (int, string, error) {
		r, _ := http.NewRequest("POST", url+"/charges", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", "kill-mid")
		if kill != "" {
			r.Header.Set("X-Kill", kill)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), nil
	}
	first := startHelper(t, "TestOneTxKillHelperProcess", oneTxKillEnv+"="+s.schema)
	if _, _, err := post(first, "mid-handler"); err == nil {
		t.Fatal("the killed process answered")
	}
	second := startHelper(t, "TestOneTxKillHelperProcess", oneTxKillEnv+"="+s.schema)
	if code, replayed, err := post(second, ""); err != nil || code != 201 || replayed != "" {
		t.Fatalf("retry: %d replayed=%q %v; want a fresh 201", code, replayed, err)
	}
	if code, replayed, err := post(second, ""); err != nil || code != 201 || replayed != "true" {
		t.Fatalf("second retry: %d replayed=%q %v; want the replay", code, replayed, err)
	}
	var rows, records int
	if err := pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM `+side+`), (SELECT count(*) FROM `+s.Table()+`)`).Scan(&rows, &records); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || records != 1 {
		t.Fatalf("%d rows, %d records; want exactly 1 of each", rows, records)
	}
}
