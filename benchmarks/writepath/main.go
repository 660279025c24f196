// Command writepath is the write-path benchmark: a handler that inserts one
// row per request in Postgres, without idempotency and behind the middleware in
// each of the Postgres store's modes, over HTTP on loopback (DESIGN section 12,
// docs/architecture.md section 9.1):
//
//	DATABASE_URL=... go run ./writepath -mode none|record|decide|decidemw|ordinary|commit|onetx|onetxread -n N -c C -dup D
//	DATABASE_URL=... go run ./writepath -mode all -modes record,decide,onetx -base record,decide -rounds 12 -n N -c C
//
// Modes: none (the handler alone: begin, insert, commit; no idempotency),
// record (none plus one row of the store's shape in its transaction, pipelined
// with the commit: no middleware, claim, lock or read, so the least that
// writing the record in the handler's transaction adds), decide (record plus
// the primary-key read of the key's record pipelined with its BEGIN: the least
// that deciding replay, 409 or run before the handler adds to the database),
// decidemw (decide behind the middleware on the memory store: the middleware's
// own work added, the Go floor of a decision before the handler), ordinary (the
// middleware on the Postgres store; the handler's own transaction, then the
// store's Complete), commit (postgres CommitResponse: the record completed in
// the handler's transaction), onetx (Store.OneTx and middleware.OneTx: claim,
// row and record in one transaction), onetxread (onetx on a store with
// WithReadFirst: a plain read before the transaction). all runs the modes (or
// those -modes names) in turn, -rounds times (every other round in reverse
// order), and prints each mode's medians and the medians of its per-round
// ratios to each -base mode.
//
// It creates the table writepath_orders (one row per request that ran) and the
// store's table writepath_records in DATABASE_URL's database, empties both
// before each run, sends N distinct keys with D concurrent copies each over C
// client connections, and prints requests/s, p50 and p99 latency over all
// requests, the answers (first executions, replays, others), and round trips,
// statements and commits per first execution as pgx sent them (a commit is an
// explicit COMMIT or a round trip outside a transaction block that is not only
// plain SELECTs, which write no WAL), and the CPU time
// per request of this process (client and server) and of the database's
// client backends (read from /proc: 0 unless Postgres runs on this host), and
// this process's heap allocations per request.
// -cpuprofile FILE writes this process's CPU profile, -memprofile FILE its
// allocation profile (every allocation recorded, which slows the runs down).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	pgstore "github.com/idemkey/idemkey/store/postgres"
)

// waitBound is how long a duplicate waits for the first copy (the middleware's
// WithWaitInFlight, the one-transaction lock wait).
const waitBound = 3 * time.Second

// allModes are the modes -mode all runs unless -modes names some.
var allModes = []string{"none", "record", "decide", "decidemw", "ordinary", "commit", "onetx", "onetxread"}

func main() {
	mode := flag.String("mode", "onetx", strings.Join(allModes, ", ")+", or all")
	n := flag.Int("n", 2000, "distinct keys")
	c := flag.Int("c", 16, "client connections (and concurrent requests)")
	dup := flag.Int("dup", 1, "concurrent copies of each key")
	rounds := flag.Int("rounds", 1, "with -mode all: rounds of the modes")
	only := flag.String("modes", "", "with -mode all: the modes to run, comma-separated (default all of them)")
	bases := flag.String("base", "none", "with -mode all: the modes the summary divides by, comma-separated")
	cpuprofile := flag.String("cpuprofile", "", "write this process's CPU profile (all runs) to this file")
	memprofile := flag.String("memprofile", "", "write this process's allocation profile (all runs) to this file")
	flag.Parse()
	if *n < 1 || *c < 1 || *dup < 1 || *rounds < 1 {
		log.Fatal("-n, -c, -dup and -rounds must be positive")
	}
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		log.Fatal("set DATABASE_URL")
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = int32(*c + 2)
	cfg.ConnConfig.Tracer = tracer{}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	st, err := pgstore.New(pool, pgstore.WithTable(recordsTable))
	if err != nil {
		log.Fatal(err)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *memprofile != "" {
		runtime.MemProfileRate = 1 // every allocation, for exact counts (and slower runs)
		defer writeAllocs(*memprofile)
	}
	run := []string{*mode}
	modes := allModes
	if *only != "" {
		modes = strings.Split(*only, ",")
	}
	if *mode == "all" {
		run = nil
		for r := range *rounds {
			round := slices.Clone(modes)
			if r%2 == 1 { // every other round backwards, so a drift in load hits every mode alike
				slices.Reverse(round)
			}
			run = append(run, round...)
		}
	}
	fmt.Printf("n=%d c=%d dup=%d\n", *n, *c, *dup)
	fmt.Println("mode      req/s    p50      p99      firsts replays others trips/1st stmts/1st commits/1st rows  goCPU/req pgCPU/req allocs/req")
	results := map[string][]result{}
	for _, m := range run {
		r, err := runMode(ctx, m, pool, st, *n, *c, *dup)
		if err != nil {
			log.Fatalf("%s: %v", m, err)
		}
		fmt.Println(r)
		results[m] = append(results[m], r)
	}
	if *mode == "all" {
		summary(results, modes, strings.Split(*bases, ","))
	}
}

// writeAllocs writes the allocation profile of the whole process to path.
func writeAllocs(path string) {
	f, err := os.Create(path)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if err := writeAllocsTo(f, 0); err != nil {
		log.Fatal(err)
	}
}

// writeAllocsTo writes the allocation profile to w (debug as in
// pprof.Profile.WriteTo). It collects garbage first: the runtime adds a cycle's
// allocations to the profile only when a collection ends, so without it those
// since the last one would be missing (as go test -memprofile does).
func writeAllocsTo(w io.Writer, debug int) error {
	runtime.GC()
	return pprof.Lookup("allocs").WriteTo(w, debug)
}

// result is one run of one mode.
type result struct {
	mode                     string
	rps                      float64
	p50, p99                 time.Duration
	firsts, replays, others  int64
	trips, statements, commi float64
	rows                     int64
	goCPU, pgCPU             time.Duration // per request: this process (client and server), the database's backends
	allocs                   float64       // heap allocations per request, this process (client and server)
}

func (r result) String() string {
	return fmt.Sprintf("%-8s %8.0f %8v %8v %6d %7d %6d %9.2f %9.2f %11.2f %d %9v %9v %7.0f", r.mode, r.rps,
		r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.firsts, r.replays, r.others,
		r.trips, r.statements, r.commi, r.rows, r.goCPU.Round(time.Microsecond), r.pgCPU.Round(time.Microsecond), r.allocs)
}

// runMode serves mode on loopback and sends the requests: a warm-up of its own
// keys first, then, on emptied tables, the measured run.
func runMode(ctx context.Context, mode string, pool *pgxpool.Pool, st *pgstore.Store, n, c, dup int) (result, error) {
	if err := setup(ctx, pool, st); err != nil {
		return result{}, err
	}
	h, err := handler(mode, pool, st)
	if err != nil {
		return result{}, err
	}
	var t tally
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	srv := &http.Server{Handler: counted(h, &t)}
	go srv.Serve(l)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: c, MaxIdleConnsPerHost: c}}
	defer client.CloseIdleConnections()
	base := "http://" + l.Addr().String() + "/orders"
	send(client, base, "warm-"+store.NewToken().String()[:8], min(n, 200), c, dup)
	if err := setup(ctx, pool, st); err != nil {
		return result{}, err
	}
	t = tally{}
	cpu0 := sampleCPU(ctx, pool)
	start := time.Now()
	lat, sendErr := send(client, base, store.NewToken().String()[:12], n, c, dup)
	elapsed := time.Since(start)
	cpu1 := sampleCPU(ctx, pool)
	if sendErr != nil {
		return result{}, sendErr
	}
	r := result{mode: mode, rps: float64(len(lat)) / elapsed.Seconds(), p50: pct(lat, 50), p99: pct(lat, 99),
		firsts: t.firsts.Load(), replays: t.replays.Load(), others: t.others.Load(),
		goCPU: (cpu1.self - cpu0.self) / time.Duration(len(lat)), pgCPU: (cpu1.pg - cpu0.pg) / time.Duration(len(lat)),
		allocs: float64(cpu1.allocs-cpu0.allocs) / float64(len(lat))}
	if f := float64(r.firsts); f > 0 {
		r.trips, r.statements, r.commi = float64(t.trips.Load())/f, float64(t.statements.Load())/f, float64(t.commits.Load())/f
	}
	err = pool.QueryRow(ctx, `SELECT count(*) FROM `+ordersTable).Scan(&r.rows)
	return r, err
}

// send posts n keys (prefix-i), dup concurrent copies each, from c workers,
// and returns every request's latency.
func send(client *http.Client, url, prefix string, n, c, dup int) ([]time.Duration, error) {
	jobs := make(chan string)
	var (
		mu       sync.Mutex
		lat      = make([]time.Duration, 0, n*dup)
		firstErr error
		wg       sync.WaitGroup
	)
	for range c {
		wg.Go(func() {
			var mine []time.Duration
			for key := range jobs {
				t0 := time.Now()
				err := post(client, url, key)
				mine = append(mine, time.Since(t0))
				if err != nil {
					mu.Lock()
					firstErr = cmpOr(firstErr, err)
					mu.Unlock()
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	for i := range n {
		key := fmt.Sprintf("%s-%d", prefix, i)
		for range dup {
			jobs <- key
		}
	}
	close(jobs)
	wg.Wait()
	return lat, firstErr
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func post(client *http.Client, url, key string) error {
	r, err := http.NewRequest("POST", url, strings.NewReader(`{"amount":100}`))
	if err != nil {
		return err
	}
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(r)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err
}

// pct returns the p-th percentile of d (sorted in place).
func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*p/100)]
}

// summary prints each mode's medians over its rounds, then, for each base, the
// medians of the per-round ratios of each mode to that base (requests/s, Go
// CPU and Postgres CPU per request, p99): round i of a mode against round i of
// the base, so a drift in the machine's load cancels out.
func summary(results map[string][]result, modes, bases []string) {
	med := func(v []float64) float64 {
		slices.Sort(v)
		return v[len(v)/2]
	}
	of := func(rs []result, f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return med(v)
	}
	fmt.Println("\nmedians over rounds   req/s     p50       p99  goCPU/req pgCPU/req stmts/1st commits/1st")
	for _, m := range modes {
		rs := results[m]
		dur := func(f func(result) time.Duration) time.Duration {
			return time.Duration(of(rs, func(r result) float64 { return float64(f(r)) })).Round(time.Microsecond)
		}
		fmt.Printf("%-18s %8.0f %9v %9v %9v %9v %9.2f %11.2f\n", m, of(rs, func(r result) float64 { return r.rps }),
			dur(func(r result) time.Duration { return r.p50 }), dur(func(r result) time.Duration { return r.p99 }),
			dur(func(r result) time.Duration { return r.goCPU }), dur(func(r result) time.Duration { return r.pgCPU }),
			of(rs, func(r result) float64 { return r.statements }), of(rs, func(r result) float64 { return r.commi }))
	}
	for _, b := range bases {
		base, ok := results[b]
		if !ok {
			continue
		}
		fmt.Printf("\nmedians of per-round ratios to %-8s  req/s  goCPU  pgCPU    p99\n", b)
		for _, m := range modes {
			rs := results[m]
			ratio := func(f func(result) float64) float64 {
				v := make([]float64, len(rs))
				for i, r := range rs {
					v[i] = f(r) / f(base[i])
				}
				return med(v)
			}
			fmt.Printf("%-38s %6.2f %6.2f %6.2f %6.2f\n", m, ratio(func(r result) float64 { return r.rps }),
				ratio(func(r result) float64 { return float64(r.goCPU) }), ratio(func(r result) float64 { return float64(r.pgCPU) }),
				ratio(func(r result) float64 { return float64(r.p99) }))
		}
	}
}
