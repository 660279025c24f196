// Package stores holds the latency benchmark of the authoritative stores side by
// side, in one run: Postgres (direct and through PgBouncer), MySQL/MariaDB, Redis
// and Redis in front of Postgres (tiered), each answering a claim+complete of a
// new key and a replay of a completed one, interleaved so that machine load hits
// all alike. The code is in
// stores_test.go:
//
//	DATABASE_URL=... REDIS_URL=... MYSQL_DSN=... [PGBOUNCER_URL=...] \
//	  go test -run '^$' -bench Stores -benchtime 2000x ./benchmarks/stores/
//
// A store whose URL is unset is left out (all are required when CI=true).
package stores
