//go:build deps

// Package deps pins the module's third-party dependencies while packages are being written.
package deps

import (
	_ "github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/labstack/echo/v4"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/tsenart/vegeta/v12/lib"
	_ "github.com/vmihailenco/msgpack/v5"
)
