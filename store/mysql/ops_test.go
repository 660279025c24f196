package mysql_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
	"github.com/idemkey/idemkey/store/mysql/mysqltest"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestConformanceSessionVariants runs the suite with the session settings that
// change what a statement reports or how it assigns: clientFoundRows (affected
// rows count matched rows, so an untouched row counts 1) and, on MariaDB, the
// SIMULTANEOUS_ASSIGNMENT mode (every assignment of an UPDATE sees the old row).
// The claim's answer must not depend on either.
func TestConformanceSessionVariants(t *testing.T) {
	variants := map[string]func(*driver.Config){
		"clientFoundRows": func(c *driver.Config) { c.ClientFoundRows = true },
	}
	db := mysqltest.DB(t)
	var version string
	if err := db.QueryRowContext(t.Context(), "SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		variants["simultaneousAssignment"] = func(c *driver.Config) {
			if c.Params == nil {
				c.Params = map[string]string{}
			}
			c.Params["sql_mode"] = "'STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT'"
		}
	}
	for name, configure := range variants {
		t.Run(name, func(t *testing.T) {
			vdb := mysqltest.DB(t, configure)
			storetest.Run(t, func(t *testing.T) storetest.Subject {
				return storetest.Subject{Store: mysqltest.Store(t, vdb)}
			})
		})
	}
}

// TestConcurrentClaimsOneWinner: many goroutines claiming the same new key, and
// then the same key whose lease expired, on separate connections: exactly one is
// Claimed each time (the second time a takeover) and every other answer is
// InFlight, even when InnoDB rolls some INSERTs back as deadlock victims. The
// leases are long (a stalled claimer must not see the winner's lease run out);
// the winner ends its lease by renewing it for a millisecond.
func TestConcurrentClaimsOneWinner(t *testing.T) {
	db := mysqltest.DB(t)
	db.SetMaxOpenConns(16)
	s := mysqltest.Store(t, db)
	ctx := t.Context()
	for round := range 10 {
		id := store.ID{Scope: "tenant", Key: fmt.Sprintf("race-%d", round)}
		req := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: 30 * time.Second, Retention: time.Minute}
		for phase, wantTakeover := range []bool{false, true} {
			var mu sync.Mutex
			outcomes := map[store.Outcome]int{}
			var winner store.Token
			var wg sync.WaitGroup
			for range 12 {
				wg.Go(func() {
					r, err := s.Claim(ctx, req)
					if err != nil {
						t.Error(err)
						return
					}
					if r.Outcome == store.Claimed && r.Takeover != wantTakeover {
						t.Errorf("phase %d: Takeover = %v", phase, r.Takeover)
					}
					mu.Lock()
					outcomes[r.Outcome]++
					if r.Outcome == store.Claimed {
						winner = r.Token
					}
					mu.Unlock()
				})
			}
			wg.Wait()
			if outcomes[store.Claimed] != 1 || outcomes[store.InFlight] != 11 {
				t.Fatalf("round %d phase %d: %v, want 1 claimed and 11 in flight", round, phase, outcomes)
			}
			if phase == 0 { // the winner's lease runs out
				if err := s.Renew(ctx, id, winner, time.Millisecond); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	t.Logf("claim retries: %d", s.Stats().ClaimRetries)
}

// TestMigrateConcurrentAndIdempotent: several processes migrating at once (the
// named lock serialises them) and again later all succeed, and the table works.
func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	db := mysqltest.DB(t)
	table := "idemkey_mig_" + store.NewToken().String()[:12]
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+table+"`, `"+table+"_migrations`")
	})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			s, err := mysql.New(db, mysql.WithTable(table))
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			if err := s.Migrate(t.Context()); err != nil {
				t.Errorf("Migrate: %v", err)
			}
		})
	}
	wg.Wait()
	s, err := mysql.New(db, mysql.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var versions int
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM `"+table+"_migrations`").Scan(&versions); err != nil || versions != mysql.SchemaVersion {
		t.Fatalf("%d versions recorded (%v), want %d", versions, err, mysql.SchemaVersion)
	}
	if _, err := s.Claim(t.Context(), store.ClaimRequest{ID: store.ID{Key: "k"}, Fingerprint: fingerprint("a"), Lease: time.Second, Retention: time.Minute}); err != nil {
		t.Fatal(err)
	}
}

// TestSweep deletes exactly the records past their retention, in batches, and
// keeps the live ones.
func TestSweep(t *testing.T) {
	db := mysqltest.DB(t)
	s := mysqltest.Store(t, db, mysql.WithSweepBatch(2))
	ctx := t.Context()
	claim := func(key string, retention time.Duration) {
		r, err := s.Claim(ctx, store.ClaimRequest{ID: store.ID{Key: key}, Fingerprint: fingerprint("a"), Lease: retention, Retention: retention})
		if err != nil || r.Outcome != store.Claimed {
			t.Fatalf("claim %s: %+v %v", key, r, err)
		}
	}
	for i := range 5 {
		claim(fmt.Sprintf("short-%d", i), 10*time.Millisecond)
	}
	claim("long", time.Hour)
	time.Sleep(30 * time.Millisecond)
	if n, err := s.Sweep(ctx, 3); err != nil || n != 3 {
		t.Fatalf("Sweep(3) = %d, %v; want 3", n, err)
	}
	if n, err := s.Sweep(ctx, 0); err != nil || n != 2 {
		t.Fatalf("Sweep(0) = %d, %v; want the 2 left", n, err)
	}
	if info, err := s.Inspect(ctx, store.ID{Key: "long"}); err != nil || info.State != store.StateInFlight {
		t.Fatalf("the live record after the sweep: %+v %v", info, err)
	}
}

// TestTakeoverRenewsRetention: a takeover sets the new claim's lease and its
// retention from the server's clock. The update assigns lease_until before
// expires_at; a takeover test on the updated row would find the fresh lease live
// and leave the old, shorter retention in place, and the claim would expire as a
// new key under its holder.
func TestTakeoverRenewsRetention(t *testing.T) {
	db := mysqltest.DB(t)
	s := mysqltest.Store(t, db)
	ctx := t.Context()
	id := store.ID{Scope: "tenant", Key: "renewed"}
	first := store.ClaimRequest{ID: id, Fingerprint: fingerprint("a"), Lease: 20 * time.Millisecond, Retention: time.Second}
	if r, err := s.Claim(ctx, first); err != nil || r.Outcome != store.Claimed {
		t.Fatalf("claim: %+v %v", r, err)
	}
	time.Sleep(50 * time.Millisecond)
	second := first
	second.Lease, second.Retention = 10*time.Second, time.Minute
	if r, err := s.Claim(ctx, second); err != nil || r.Outcome != store.Claimed || !r.Takeover {
		t.Fatalf("takeover: %+v %v", r, err)
	}
	time.Sleep(time.Second) // past the first claim's retention
	if r, err := s.Claim(ctx, second); err != nil || r.Outcome != store.InFlight {
		t.Fatalf("after the first retention: %+v %v, want the takeover still in flight", r, err)
	}
	info, err := s.Inspect(ctx, id)
	if err != nil || info.ExpiresAt.Sub(info.Now) < 50*time.Second {
		t.Fatalf("inspect: %+v %v, want the takeover's retention of a minute", info, err)
	}
}
