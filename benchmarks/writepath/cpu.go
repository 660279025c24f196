package main

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/cputime"
)

// clkTck is the kernel's clock tick of /proc/PID/stat's utime and stime
// (USER_HZ, 100 on Linux).
const clkTck = 100

// cpuSample is the CPU time used so far by this process and by the database's
// client backends (read from /proc: only when Postgres runs on this host,
// otherwise pg stays 0), and this process's heap allocations (objects).
type cpuSample struct {
	self, pg time.Duration
	allocs   uint64
}

func sampleCPU(ctx context.Context, pool *pgxpool.Pool) cpuSample {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := cpuSample{self: cputime.Used(), allocs: ms.Mallocs}
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname = current_database()`)
	if err != nil {
		return s
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			s.pg += procCPU(pid)
		}
	}
	return s
}

// procCPU returns the user and system CPU time of process pid (0 when unknown).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])) // fields from 3 (state) on
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64) // field 14, utime
	k, _ := strconv.ParseInt(f[12], 10, 64) // field 15, stime
	return time.Duration(u+k) * time.Second / clkTck
}
