// Package postgres holds the end-to-end benchmark of the idempotency middleware
// with the Postgres store. The code is in middleware_test.go:
//
//	DATABASE_URL=... go test -run '^$' -bench . ./benchmarks/postgres/
package postgres
