// Package postgres holds the end-to-end benchmark of the idempotency middleware
// with the Postgres store (issue 3, item 7). The code is in middleware_test.go:
//
//	DATABASE_URL=... go test -run '^$' -bench . ./benchmarks/postgres/
package postgres
