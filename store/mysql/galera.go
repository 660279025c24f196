package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// On a Galera cluster (MariaDB Galera, Percona XtraDB Cluster) a node applies
// the other nodes' commits asynchronously: a statement sent to another node
// than the one that committed the claim may not see the claim yet. Behind a
// proxy that spreads one request's statements over the nodes, the completion's
// UPDATE then finds no row held by its token (a false store.ErrLeaseLost: the
// key stays claimed until its lease ends, and the next retry runs the handler
// again), and a claim's read misses a completed record. With wsrep_sync_wait
// covering reads (1), UPDATE and DELETE (2) and INSERT (4), a node first
// applies everything the cluster committed before it runs the statement: the
// store's statements are then causal, whichever node runs them
// (docs/operations.md, "Galera").

// GaleraSyncWait is the wsrep_sync_wait the store needs on a Galera cluster:
// causal reads (1), UPDATE and DELETE (2), INSERT and REPLACE (4). Higher bits
// (8, SHOW) may be set too.
const GaleraSyncWait = 7

// ErrGaleraSyncWait is returned (wrapped) by Migrate on a Galera node
// (wsrep_on=ON) whose session's wsrep_sync_wait lacks any bit of
// GaleraSyncWait. Fix: add "wsrep_sync_wait=7" to the DSN's parameters
// (go-sql-driver sets it on every connection it opens), or set it globally on
// every node.
var ErrGaleraSyncWait = errors.New("idemkey/store/mysql: Galera without causal reads (wsrep_sync_wait)")

// galeraSQL reads the two variables in one round trip; MySQL without Galera
// has neither and returns no row.
const galeraSQL = `SHOW SESSION VARIABLES WHERE Variable_name IN ('wsrep_on', 'wsrep_sync_wait')`

// checkGalera refuses a Galera session without causal reads (ErrGaleraSyncWait).
// It runs on conn, one of the pool's connections: a DSN parameter or a global
// setting applies to them all.
func checkGalera(ctx context.Context, conn *sql.Conn) error {
	rows, err := conn.QueryContext(ctx, galeraSQL)
	if err != nil {
		return fmt.Errorf("idemkey/store/mysql: read wsrep_on: %w", err)
	}
	defer rows.Close()
	vars := map[string]string{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return fmt.Errorf("idemkey/store/mysql: read wsrep_on: %w", err)
		}
		vars[strings.ToLower(name)] = value
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("idemkey/store/mysql: read wsrep_on: %w", err)
	}
	if !strings.EqualFold(vars["wsrep_on"], "ON") {
		return nil
	}
	wait, _ := strconv.Atoi(vars["wsrep_sync_wait"])
	if wait&GaleraSyncWait == GaleraSyncWait {
		return nil
	}
	return fmt.Errorf("idemkey/store/mysql: %w: this server is a Galera node (wsrep_on=ON) and the session's wsrep_sync_wait is %d; "+
		"statements sent to another node than the claim's may not see it (false lease lost, a key run twice): "+
		"add wsrep_sync_wait=%d to the DSN's parameters or set it globally on every node", ErrGaleraSyncWait, wait, GaleraSyncWait)
}
