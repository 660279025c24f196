package setup

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkey/idemkey/store/mysql"
)

// MySQLStore builds the mysql store (IDEM_STORE=mysql) on conns.MySQL in the
// table IDEM_TABLE: migrated now, swept every minute, its prepared statements
// closed at conns.Close. Errors are the store's, wrapped.
func MySQLStore(ctx context.Context, env Env, conns *Conns, logger *slog.Logger) (*mysql.Store, error) {
	st, err := mysql.New(conns.MySQL, mysql.WithTable(env.IdemTable), mysql.WithLogger(logger))
	if err == nil {
		err = st.Migrate(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("mysql store: %w", err)
	}
	conns.OnClose(func() { _ = st.Close() })
	conns.OnClose(st.StartSweeper(context.Background(), time.Minute))
	return st, nil
}
