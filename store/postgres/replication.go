package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// A completed record is only as durable as the commit that wrote it. When the
// primary fails and a standby is promoted, every commit the standby had not
// received is lost: the record of a key whose call was already answered
// vanishes, and the client's retry runs the side effect a second time
// (docs/operations.md, "Postgres replication"). Only a synchronous standby
// (synchronous_standby_names set and synchronous_commit on, remote_write or
// remote_apply) makes the store's answers survive a failover. Migrate reports
// what the server says: one warning when commits do not wait for a standby, or
// an error with WithSynchronousStandby.

// ErrNotSynchronous is returned (wrapped) by Migrate with WithSynchronousStandby
// when the store's commits do not wait for a synchronous standby, or when the
// store is connected to a standby.
var ErrNotSynchronous = errors.New("idemkey/store/postgres: commits do not wait for a synchronous standby")

// replicationPolicy is the store's start-up check of replication (Migrate).
type replicationPolicy struct {
	require bool        // WithSynchronousStandby
	warned  atomic.Bool // the default's warning is logged once per Store
}

// WithSynchronousStandby makes Migrate fail with ErrNotSynchronous unless the
// store's commits wait for a synchronous standby (Replication.WaitsForStandby),
// so a payments service refuses to start where a failover could lose answered
// keys. Without it Migrate logs one warning (WithLogger) and goes on.
func WithSynchronousStandby() Option { return func(s *Store) { s.repl.require = true } }

// Replication is what the server says about the durability of the store's
// commits, read with the store's own connection settings.
type Replication struct {
	// SynchronousCommit is the session's synchronous_commit (on, remote_apply,
	// remote_write, local, off): set per server, database, role or session.
	SynchronousCommit string
	// SynchronousStandbyNames is the server's synchronous_standby_names; empty:
	// no commit waits for a standby.
	SynchronousStandbyNames string
	// Standby is set when the server is in recovery (a standby): the store
	// cannot write there.
	Standby bool
	// SyncStandbys is the number of connected standbys in sync or quorum state
	// (pg_stat_replication), or -1 when the role may not see it
	// (pg_read_all_stats). 0 with SynchronousStandbyNames set means every
	// commit hangs until one connects: the state of a standby promoted with
	// the primary's setting (docs/operations.md).
	SyncStandbys int
}

// WaitsForStandby reports whether a commit returns only after a synchronous
// standby has it: the only mode in which a failover keeps every answered key.
func (r Replication) WaitsForStandby() bool {
	if r.Standby || r.SynchronousStandbyNames == "" {
		return false
	}
	switch r.SynchronousCommit {
	case "on", "remote_write", "remote_apply":
		return true
	}
	return false
}

func (r Replication) String() string {
	return fmt.Sprintf("synchronous_commit=%s synchronous_standby_names=%q standby=%t sync_standbys=%d",
		r.SynchronousCommit, r.SynchronousStandbyNames, r.Standby, r.SyncStandbys)
}

// replicationSQL reads the settings that decide whether a commit waits for a
// standby. It is sent with the simple protocol: one round trip, no prepared
// statement, so it also works behind a transaction pooler.
const replicationSQL = `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
    pg_is_in_recovery(),
    CASE WHEN bool_or(sync_state IS NULL AND pid IS NOT NULL) THEN -1
         ELSE count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) END::int
FROM pg_stat_replication`

// Replication reads the server's replication settings as the store's
// connections see them (one statement, no write). Migrate calls it.
func (s *Store) Replication(ctx context.Context) (Replication, error) {
	var r Replication
	err := s.db.QueryRow(ctx, replicationSQL, pgx.QueryExecModeSimpleProtocol).
		Scan(&r.SynchronousCommit, &r.SynchronousStandbyNames, &r.Standby, &r.SyncStandbys)
	if err != nil {
		return Replication{}, fmt.Errorf("idemkey/store/postgres: read replication settings: %w", err)
	}
	return r, nil
}

// checkReplication is Migrate's start-up report: an error with
// WithSynchronousStandby when commits do not wait for a standby, else one
// warning per Store when they do not, or when they would hang.
func (s *Store) checkReplication(ctx context.Context) error {
	r, err := s.Replication(ctx)
	if err != nil {
		return err
	}
	waits := r.WaitsForStandby()
	if !waits && s.repl.require {
		return fmt.Errorf("idemkey/store/postgres: %w (%s): a failover may lose answered keys; "+
			"set synchronous_standby_names and synchronous_commit=on, or drop WithSynchronousStandby", ErrNotSynchronous, r)
	}
	switch {
	case s.repl.warned.Load():
	case !waits:
		s.repl.warned.Store(true)
		s.log().Warn("idemkey/store/postgres: commits do not wait for a synchronous standby: "+
			"if this server fails over, keys already answered can run again (docs/operations.md)",
			"table", s.qualified, "replication", r.String())
	case r.SyncStandbys == 0:
		s.repl.warned.Store(true)
		s.log().Warn("idemkey/store/postgres: synchronous_standby_names is set but no synchronous standby is connected: "+
			"every commit waits until one connects (after a promotion: ALTER SYSTEM RESET synchronous_standby_names)",
			"table", s.qualified, "replication", r.String())
	}
	return nil
}
