// Package integration holds the tests of store/sharded over two real Postgres
// databases (store/postgres on each), in a module of its own so the core module
// stays free of third-party requires. Its tests need DATABASE_URL; the second
// database is DATABASE_URL's with "b" appended to its name, created when absent.
package integration
