package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// partitionsSQL lists the records table's partitions, whether each is pending a
// detach (a sweep stopped half-way), its estimated row count, and the current
// epoch on the server's clock.
const partitionsSQL = `SELECT coalesce(array_agg(c.relname::text ORDER BY c.relname), '{}'),
       coalesce(array_agg(i.inhdetachpending ORDER BY c.relname), '{}'),
       coalesce(array_agg(greatest(c.reltuples, 0)::bigint ORDER BY c.relname), '{}'),
       floor(extract(epoch FROM clock_timestamp()) / $2)::bigint
FROM (SELECT $1::regclass AS parent) AS p
LEFT JOIN pg_inherits i ON i.inhparent = p.parent
LEFT JOIN pg_class c ON c.oid = i.inhrelid`

// sweepPartitions is Sweep in the partitioned layout: it fails (store.ErrInvalid)
// on a table of the other layout or another epoch; otherwise, on a session of its own,
// one sweeper of the table at a time (a session advisory lock; a store that
// finds it taken returns 0 at once), it creates the partitions of the current
// and next epochs, drops the partitions an earlier sweep detached but, stopped,
// did not drop (see the migration's drop_detached function for how it knows
// them), then drops every partition of a past epoch whose records have all
// expired. It returns the dropped partitions' estimated row counts
// (pg_class.reltuples), summed.
func (p *partitioned) sweep(ctx context.Context) (dropped int64, err error) {
	s := p.s
	q, done, err := p.session(ctx)
	if err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres: sweep: %w", err)
	}
	defer done()
	if err := s.checkLayout(ctx, q); err != nil { // another epoch would number the partitions in other units
		return 0, fmt.Errorf("idemkey/store/postgres: sweep: %w", err)
	}
	var locked bool
	if err := q.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, 1)`, p.lockClass()).Scan(&locked); err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres: sweep: %w", err)
	}
	if !locked {
		return 0, nil // another process sweeps this table now
	}
	defer func() {
		if _, uerr := q.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, 1)`, p.lockClass()); uerr != nil && err == nil {
			err = fmt.Errorf("idemkey/store/postgres: sweep: unlock: %w", uerr)
		}
	}()
	if _, err := p.ensure(ctx, q); err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres: sweep: create partitions: %w", err)
	}
	var left int64
	if err := q.QueryRow(ctx, `SELECT `+s.ident(s.table+"_drop_detached")+`()`).Scan(&left); err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres: sweep: drop detached partitions: %w", err)
	}
	dropped = left
	var (
		names   []string
		pending []bool
		rows    []int64
		cur     int64
	)
	if err := q.QueryRow(ctx, partitionsSQL, s.qualified, int64(p.epoch.Seconds())).Scan(&names, &pending, &rows, &cur); err != nil {
		return 0, fmt.Errorf("idemkey/store/postgres: sweep: list partitions: %w", err)
	}
	for i, name := range names {
		epoch, ok := p.epochOf(name)
		if !ok || epoch >= cur {
			continue // not ours, or the current epoch's or later
		}
		gone, err := p.drop(ctx, q, name, pending[i])
		if err != nil {
			return dropped, fmt.Errorf("idemkey/store/postgres: sweep: partition %s: %w", name, err)
		}
		if gone {
			dropped += rows[i]
		}
	}
	return dropped, nil
}

// partitionEpoch parses the epoch out of a partition's name, "<table>_p<epoch>".
func (p *partitioned) epochOf(name string) (int64, bool) {
	s := p.s
	digits, ok := strings.CutPrefix(name, s.table+"_p")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	return n, err == nil && strconv.FormatInt(n, 10) == digits // "+7", "07": not ours
}

// dropPartition detaches and drops the partition name when all its records
// have expired (or when a stopped sweep left it pending a detach), and tells
// whether it did. A partition whose lock is not granted within the wait is left
// to the next sweep.
func (p *partitioned) drop(ctx context.Context, q Querier, name string, pending bool) (bool, error) {
	s := p.s
	part := s.ident(name)
	if pending {
		if _, err := q.Exec(ctx, `ALTER TABLE `+s.qualified+` DETACH PARTITION `+part+` FINALIZE`); err != nil {
			return false, err
		}
	} else {
		var expired bool
		err := q.QueryRow(ctx, `SELECT `+s.ident(s.table+"_expired")+`($1::regclass, $2)`, part, expiredLockWait).Scan(&expired)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55P03" {
			return false, nil // lock not available: writers busy on it, next time
		}
		if err != nil || !expired {
			return false, err
		}
		// The mark first, in its own transaction: should the sweep stop after the
		// detach, the next one finds the table by it.
		if _, err := q.Exec(ctx, `COMMENT ON TABLE `+part+` IS `+literal(p.detachedComment())); err != nil {
			return false, err
		}
		if _, err := q.Exec(ctx, `ALTER TABLE `+s.qualified+` DETACH PARTITION `+part+` CONCURRENTLY`); err != nil {
			return false, err
		}
	}
	_, err := q.Exec(ctx, `DROP TABLE IF EXISTS `+part)
	return err == nil, err
}

// session returns a querier bound to one connection (one taken from the pool
// when the store's Querier is a pool) and the function that gives it back.
func (p *partitioned) session(ctx context.Context) (Querier, func(), error) {
	s := p.s
	a, ok := s.db.(acquirer)
	if !ok {
		return s.db, func() {}, nil // a connection: its own session
	}
	conn, err := a.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return conn, conn.Release, nil
}

var _ Querier = (*pgx.Conn)(nil)
