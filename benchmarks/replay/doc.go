// Package replay measures what a replay (a claim answered Completed) costs on
// each store that can sit behind the middleware: the tiered store with the
// memory store as its in-process cache in front of Postgres, the tiered store
// with Redis in front of Postgres, Postgres alone and Redis alone. The code is
// in replay_test.go:
//
//	DATABASE_URL=... REDIS_URL=... go test -run '^$' -bench . -benchmem ./benchmarks/replay/
package replay
