package postgres

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/claim"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// killHelperEnv names the schema the helper process serves; set only in the child.
const killHelperEnv = "IDEMKEY_KILL_HELPER_SCHEMA"

// TestKillHelperProcess is not a test: it is the server process that
// TestKillAroundCommit starts (this test binary, re-executed) and kills with
// SIGKILL. Its handler inserts a row and completes the record in one transaction;
// the X-Kill header makes it kill itself just before or just after the commit.
func TestKillHelperProcess(t *testing.T) {
	schema := os.Getenv(killHelperEnv)
	if schema == "" {
		t.Skip("helper process of TestKillAroundCommit")
	}
	pool, s := helperStore(t, schema)
	side := s.ident("charges")
	m, err := middleware.New(s, middleware.GlobalScope, middleware.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	die := func() { syscall.Kill(os.Getpid(), syscall.SIGKILL); select {} }
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		cl, _ := claim.FromContext(ctx)
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), 503)
			return
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if _, err := tx.Exec(ctx, `INSERT INTO `+side+` (key) VALUES ($1)`, cl.ID.Key); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		resp := store.Response{Status: 201, Body: []byte("charged by pid " + fmt.Sprint(os.Getpid()))}
		if err := s.CompleteTx(ctx, tx, cl.ID, cl.Token, resp, cl.Retention); err != nil {
			http.Error(w, err.Error(), 409)
			return
		}
		if r.Header.Get("X-Kill") == "before-commit" {
			die()
		}
		if err := tx.Commit(ctx); err != nil {
			http.Error(w, err.Error(), 503)
			return
		}
		if r.Header.Get("X-Kill") == "after-commit" {
			die() // committed; the response is never sent
		}
		claim.MarkCompleted(ctx, resp)
		w.WriteHeader(resp.Status)
		w.Write(resp.Body)
	}))
	serveHelper(t, h)
}

// helperStore connects a helper process to DATABASE_URL and returns its pool and
// the store in schema.
func helperStore(t *testing.T, schema string) (*pgxpool.Pool, *Store) {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(pool, WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	return pool, s
}

// serveHelper serves h on a free loopback port and prints the "listening on"
// line startHelper waits for.
func serveHelper(t *testing.T, h http.Handler) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("listening on http://%s\n", l.Addr())
	http.Serve(l, h)
}

// startKillHelper runs the helper process and returns its base URL.
func startKillHelper(t *testing.T, schema string) string {
	t.Helper()
	return startHelper(t, "TestKillHelperProcess", killHelperEnv+"="+schema)
}

// startHelper runs the test named test of this binary as a server process with
// env added and returns its base URL (from its "listening on" line).
func startHelper(t *testing.T, test, env string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), env)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
			go io.Copy(io.Discard, out)
			return addr
		}
	}
	t.Fatalf("helper exited before listening: %v", sc.Err())
	return ""
}

// TestKillAroundCommit kills the serving process with SIGKILL right after the
// handler's transaction committed (before the response was sent), and right before
// the commit. After a restart the retry replays the committed response in the
// first case and runs once (after the dead holder's lease) in the second; either
// way exactly one row.
func TestKillAroundCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts processes")
	}
	pool := newPool(t, "")
	s := newStore(t, pool, nil)
	side := sideTable(t, pool, s, "")
	post := func(url, key, kill string) (int, string, string, error) {
		r, _ := http.NewRequest("POST", url+"/charges", strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", key)
		if kill != "" {
			r.Header.Set("X-Kill", kill)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			return 0, "", "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed"), nil
	}
	rows := func(key string) int {
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+side+` WHERE key = $1`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, kill := range []string{"after-commit", "before-commit"} {
		t.Run(kill, func(t *testing.T) {
			key := "kill-" + kill
			first := startKillHelper(t, s.schema)
			if _, _, _, err := post(first, key, kill); err == nil {
				t.Fatal("the killed process answered")
			}
			second := startKillHelper(t, s.schema) // the restart
			deadline := time.Now().Add(10 * time.Second)
			for {
				code, body, replayed, err := post(second, key, "")
				if err != nil {
					t.Fatal(err)
				}
				if code == http.StatusConflict && kill == "before-commit" && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond) // the dead holder's lease (1s) runs out on the server's clock
					continue
				}
				switch {
				case code != 201:
					t.Fatalf("retry: %d %q", code, body)
				case kill == "after-commit" && replayed != "true":
					t.Fatalf("retry after a kill past the commit ran again: %q", body)
				case kill == "before-commit" && replayed == "true":
					t.Fatalf("retry after a kill before the commit replayed %q", body)
				}
				break
			}
			if n := rows(key); n != 1 {
				t.Fatalf("%d rows, want exactly 1", n)
			}
			if _, _, replayed, err := post(second, key, ""); err != nil || replayed != "true" {
				t.Fatalf("second retry: replayed=%q %v", replayed, errors.Unwrap(err))
			}
		})
	}
}
