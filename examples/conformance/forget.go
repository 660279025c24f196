package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// forgetFunc deletes every record of a persistent store, for POST /reset: the
// store is shared by every fixture on it, so a reset on any of them forgets the
// keys for all, and they keep sharing the keys stored after it.
type forgetFunc func(ctx context.Context) error

// forgetPostgres deletes every row of the Postgres store's table.
func forgetPostgres(pool *pgxpool.Pool, table string) forgetFunc {
	stmt := `DELETE FROM ` + pgx.Identifier{table}.Sanitize()
	return func(ctx context.Context) error {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("deleting the records in %s: %w", table, err)
		}
		return nil
	}
}

// forgetRedis deletes every key under the Redis store's prefix.
func forgetRedis(client goredis.UniversalClient, prefix string) forgetFunc {
	pattern := globEscape(prefix) + "*"
	return func(ctx context.Context) error {
		iter := client.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			if err := client.Unlink(ctx, iter.Val()).Err(); err != nil {
				return fmt.Errorf("deleting the records under %q: %w", prefix, err)
			}
		}
		if err := iter.Err(); err != nil {
			return fmt.Errorf("listing the records under %q: %w", prefix, err)
		}
		return nil
	}
}

// both runs f then g.
func both(f, g forgetFunc) forgetFunc {
	return func(ctx context.Context) error {
		if err := f(ctx); err != nil {
			return err
		}
		return g(ctx)
	}
}

// globEscape escapes the characters special to a Redis SCAN MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if strings.IndexByte(`*?[]\^-`, c) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

// forgetSQL deletes every row of the MySQL store's table.
func forgetSQL(db *sql.DB, table string) forgetFunc {
	stmt := "DELETE FROM `" + strings.ReplaceAll(table, "`", "``") + "`"
	return func(ctx context.Context) error {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("deleting the records in %s: %w", table, err)
		}
		return nil
	}
}
