module github.com/idemkey/idemkey/cmd

go 1.26.0

require (
	github.com/google/uuid v1.6.0
	github.com/idemkey/idemkey v0.1.0
	github.com/idemkey/idemkey/celeriant v0.1.0
	github.com/idemkey/idemkey/store/postgres v0.1.0
	github.com/idemkey/idemkey/store/redis v0.1.0
	github.com/jackc/pgx/v5 v5.13.0
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)
