package postgres

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPartitionSweepDropsDetachedLeftover: a sweep that stops between DETACH
// PARTITION CONCURRENTLY and DROP TABLE (here its DROP fails: a view pins the
// partition) leaves a standalone table no longer among the partitions; the next
// sweep drops it. Tables that are not the sweep's own survive: a partition
// detached by hand (its exact name, no mark of the sweep) and tables whose names
// only resemble a partition's.
func TestPartitionSweepDropsDetachedLeftover(t *testing.T) {
	e := newPartEnv(t)
	ctx := t.Context()
	old, byHand := e.cur-3, e.cur-5
	e.addPartition(old)
	e.addPartition(byHand)
	e.exec(`ALTER TABLE ` + e.s.Table() + ` DETACH PARTITION ` + e.part(byHand))
	lookalikes := []string{
		fmt.Sprintf("%s_p%d_old", e.s.table, old),
		fmt.Sprintf("%s_p0%d", e.s.table, old),
		fmt.Sprintf("%s_p+%d", e.s.table, old),
		fmt.Sprintf("x%s_p%d", e.s.table, old),
	}
	for _, name := range lookalikes {
		e.exec(`CREATE TABLE ` + e.s.ident(name) + ` (LIKE ` + e.s.Table() + `)`)
	}
	pin := e.s.ident("pin")
	e.exec(`CREATE VIEW ` + pin + ` AS SELECT * FROM ` + e.part(old))
	if _, err := e.s.Sweep(ctx, 0); err == nil || !strings.Contains(err.Error(), "depend") {
		t.Fatalf("sweep with the partition pinned: %v, want its DROP TABLE to fail", err)
	}
	var attached bool
	if err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_inherits WHERE inhrelid = $1::regclass)`, e.part(old)).Scan(&attached); err != nil || attached {
		t.Fatalf("after the failed sweep the partition is attached: %v %v, want detached and left", attached, err)
	}
	e.exec(`DROP VIEW ` + pin)
	if _, err := e.s.Sweep(ctx, 0); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if e.hasPartition(old) {
		t.Errorf("the detached partition of epoch %d is left after the next sweep (a storage leak)", old-e.cur)
	}
	if !e.hasPartition(byHand) {
		t.Errorf("the partition detached by hand was dropped")
	}
	for _, name := range lookalikes {
		var ok bool
		if err := e.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, e.s.ident(name)).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s: exists %v (%v), want kept", name, ok, err)
		}
	}
}

// advisoryLock is a row of pg_locks for an advisory lock.
type advisoryLock struct {
	classid, objid uint32
	objsubid       int16
}

// heldAdvisory runs sql in a transaction and returns the advisory locks its
// session holds before the transaction ends.
func heldAdvisory(t *testing.T, e *partEnv, sql string, args ...any) []advisoryLock {
	t.Helper()
	tx := begin(t, e.pool)
	if _, err := tx.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	rows, err := tx.Query(t.Context(), `SELECT classid, objid, objsubid FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`)
	if err != nil {
		t.Fatal(err)
	}
	locks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (advisoryLock, error) {
		var l advisoryLock
		return l, r.Scan(&l.classid, &l.objid, &l.objsubid)
	})
	if err != nil {
		t.Fatal(err)
	}
	return locks
}

// TestPartitionKeyLocksApartFromTableLocks: a claim's lock on its key is of the
// single-bigint form (objsubid 1), the table's hash in the high half and the
// key's in the low half, while partition creation locks (table, 0) in the two-int4
// form (objsubid 2): so no key, whatever its hash, shares a table-level lock.
func TestPartitionKeyLocksApartFromTableLocks(t *testing.T) {
	e := newPartEnv(t)
	id := newID()
	var hash int32
	if err := e.pool.QueryRow(t.Context(), `SELECT hashtext(encode(sha256(int4send(length($1::bytea)) || $1::bytea || $2::bytea), 'hex'))`,
		[]byte(id.Scope), []byte(id.Key)).Scan(&hash); err != nil {
		t.Fatal(err)
	}
	class := uint32(e.s.part.lockClass())
	fp, tok := fingerprint("fp"), fingerprint("token")
	key := heldAdvisory(t, e, e.s.claimSQL, []byte(id.Scope), []byte(id.Key), fp[:], tok[:16], int64(60000), int64(3600000))
	if want := (advisoryLock{class, uint32(hash), 1}); len(key) != 1 || key[0] != want {
		t.Errorf("claim's advisory locks %+v, want one %+v (bigint form, objsubid 1)", key, want)
	}
	table := heldAdvisory(t, e, `SELECT `+e.s.ident(e.s.table+"_ensure")+`(0)`)
	if want := (advisoryLock{class, 0, 2}); len(table) != 1 || table[0] != want {
		t.Errorf("partition creation's advisory locks %+v, want one %+v (two-int4 form, objsubid 2)", table, want)
	}
}
