package mysql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/internal/testenv"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
	"github.com/idemkey/idemkey/store/mysql/mysqltest"
	"github.com/idemkey/idemkey/store/storetest"
)

// The Galera suite runs against the 3-node cluster of GALERA_DSNS (three
// go-sql-driver DSNs, comma-separated; .ci/galera starts one on loopback)
// through a connector that opens each new connection on the next node, as a
// round-robin proxy in front of a cluster does: one request's statements run
// on different nodes.

// galeraDSNs returns the cluster's DSNs, skipping the test without
// GALERA_DSNS (failing when CI=true).
func galeraDSNs(t *testing.T) []string {
	t.Helper()
	v := testenv.Getenv(t, "GALERA_DSNS", "the Galera cluster of .ci/galera")
	dsns := strings.Split(v, ",")
	if len(dsns) < 3 {
		t.Fatalf("GALERA_DSNS has %d DSNs, want 3", len(dsns))
	}
	return dsns
}

// roundRobin opens each connection on the next node, skipping nodes that do
// not answer (a proxy's health check).
type roundRobin struct {
	nodes []driver.Connector
	next  atomic.Uint32
}

func (r *roundRobin) Connect(ctx context.Context) (driver.Conn, error) {
	first := r.next.Add(1)
	var err error
	for i := range uint32(len(r.nodes)) {
		var c driver.Conn
		if c, err = r.nodes[(first+i)%uint32(len(r.nodes))].Connect(ctx); err == nil {
			return c, nil
		}
	}
	return nil, err
}

func (r *roundRobin) Driver() driver.Driver { return r.nodes[0].Driver() }

// galeraDB opens the cluster (only the nodes of the indexes only, if any)
// through roundRobin with the session's wsrep_sync_wait set to syncWait (-1:
// the server's default) and closes it when the test ends.
func galeraDB(t *testing.T, syncWait int, only ...int) *sql.DB {
	t.Helper()
	rr := &roundRobin{}
	for i, dsn := range galeraDSNs(t) {
		if len(only) > 0 && !slices.Contains(only, i) {
			continue
		}
		cfg, err := gomysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("GALERA_DSNS: %v", err)
		}
		if syncWait >= 0 {
			if cfg.Params == nil {
				cfg.Params = map[string]string{}
			}
			cfg.Params["wsrep_sync_wait"] = strconv.Itoa(syncWait)
		}
		c, err := gomysql.NewConnector(cfg)
		if err != nil {
			t.Fatalf("GALERA_DSNS: %v", err)
		}
		rr.nodes = append(rr.nodes, c)
	}
	db := sql.OpenDB(rr)
	db.SetMaxIdleConns(32)
	t.Cleanup(func() { _ = db.Close() })
	if err := db.PingContext(t.Context()); err != nil {
		t.Fatalf("GALERA_DSNS: %v", err)
	}
	return db
}

// TestGaleraRefusesStaleReads: on a Galera node whose session lacks
// wsrep_sync_wait=7, Migrate refuses with ErrGaleraSyncWait and creates nothing;
// with it, Migrate succeeds.
func TestGaleraRefusesStaleReads(t *testing.T) {
	for _, wait := range []int{0, 1, 3, 6} {
		db := galeraDB(t, wait)
		table := "idemkey_galera_refused_" + store.NewToken().String()[:8]
		s, err := mysql.New(db, mysql.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(t.Context()); !errors.Is(err, mysql.ErrGaleraSyncWait) {
			t.Fatalf("Migrate with wsrep_sync_wait=%d: %v, want ErrGaleraSyncWait", wait, err)
		}
		var n int
		if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?",
			table+"%").Scan(&n); err != nil || n != 0 {
			t.Errorf("a refused Migrate left %d tables (err %v)", n, err)
		}
	}
	for _, wait := range []int{mysql.GaleraSyncWait, 15} {
		mysqltest.Store(t, galeraDB(t, wait)) // Migrate succeeds
	}
}

// TestGaleraConformance runs the store contract suite through the round-robin
// connector with wsrep_sync_wait=7.
func TestGaleraConformance(t *testing.T) {
	began := time.Now()
	db := galeraDB(t, mysql.GaleraSyncWait)
	t.Cleanup(func() {
		suiteReport(t, "galera, the store suite through a round-robin connector took %v", time.Since(began).Round(100*time.Millisecond))
	})
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: mysqltest.Store(t, db)}
	})
}

// TestGaleraCrossNodeComplete claims 1,000 keys on one node and completes each
// on another at once, 16 at a time, as a proxy that spreads one request's
// statements does: with wsrep_sync_wait=7 every completion finds its claim;
// the count of false "lease lost" at 0 is logged (it depends on timing).
func TestGaleraCrossNodeComplete(t *testing.T) {
	const keys, workers = 1000, 16
	began := time.Now()
	counts, failed := map[int]int{}, map[int]int{}
	for _, wait := range []int{0, mysql.GaleraSyncWait} {
		claimer := mysqltest.Store(t, galeraDB(t, mysql.GaleraSyncWait, 0))
		completer, err := mysql.New(galeraDB(t, wait, 1), mysql.WithTable(strings.Trim(claimer.Table(), "`")))
		if err != nil {
			t.Fatal(err)
		}
		var lost, errs atomic.Int32
		var next atomic.Int32
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for k := next.Add(1); k <= keys; k = next.Add(1) {
					id := store.ID{Scope: "galera-cross", Key: strconv.Itoa(int(k))}
					res, err := claimer.Claim(t.Context(), store.ClaimRequest{ID: id, Lease: time.Minute, Retention: time.Hour})
					if err != nil || res.Outcome != store.Claimed {
						t.Errorf("claim %s: %v %v", id.Key, res.Outcome, err)
						return
					}
					err = completer.Complete(t.Context(), id, res.Token, store.Response{Status: 200}, time.Hour)
					switch {
					case errors.Is(err, store.ErrLeaseLost):
						lost.Add(1)
					case err != nil: // deadlocks (1213): the claim's write set aborted the completion
						if errs.Add(1); wait == mysql.GaleraSyncWait {
							t.Errorf("complete %s on another node: %v", id.Key, err)
						}
					}
				}
			})
		}
		wg.Wait()
		_ = completer.Close()
		counts[wait], failed[wait] = int(lost.Load()), int(errs.Load())
	}
	suiteReport(t, "galera, claimed on one node and completed on another: %d keys; false lease lost: %d with wsrep_sync_wait=0, %d with 7; "+
		"other completion errors: %d with 0, %d with 7; took %v", keys, counts[0], counts[mysql.GaleraSyncWait],
		failed[0], failed[mysql.GaleraSyncWait], time.Since(began).Round(100*time.Millisecond))
	if counts[mysql.GaleraSyncWait] != 0 {
		t.Errorf("%d completions on another node lost their lease with wsrep_sync_wait=7, want 0", counts[mysql.GaleraSyncWait])
	}
}

// suiteReport logs a suite's summary line and appends it to the file
// IDEMKEY_SUITE_REPORT names, if any: .ci/run prints that file when it ends,
// since go test shows a passing package's logs only with -v.
func suiteReport(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	if path := os.Getenv("IDEMKEY_SUITE_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("suite report: %v", err)
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "%s: %s\n", t.Name(), line)
	}
}
