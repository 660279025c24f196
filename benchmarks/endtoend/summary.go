package main

import (
	"fmt"

	"github.com/idemkey/idemkey/benchmarks/internal/httpload"
)

// ratio is one figure of the summary: num/den per round, then the median.
// Redis CPU figures are the sequential phase's (seq-us).
type ratio struct {
	name     string
	target   string
	num, den func(r roundResult) (float64, bool)
}

func runOf(key string, f func(runResult) float64) func(roundResult) (float64, bool) {
	return func(r roundResult) (float64, bool) {
		x, ok := r.runs[key]
		return f(x), ok
	}
}

func rps(x runResult) float64      { return x.rps }
func cpu(x runResult) float64      { return x.cpuPerReq }
func redisCPU(x runResult) float64 { return x.seq.cpuPerReq }

// added is a middleware's server CPU per request over its framework's bare run.
func added(key, bare string) func(roundResult) (float64, bool) {
	return func(r roundResult) (float64, bool) {
		x, ok1 := r.runs[key]
		b, ok2 := r.runs[bare]
		return x.cpuPerReq - b.cpuPerReq, ok1 && ok2
	}
}

func plainGet(r roundResult) (float64, bool)  { return r.get.cpuPerReq, true }
func plainSet(r roundResult) (float64, bool)  { return r.set.cpuPerReq, true }
func emptyEval(r roundResult) (float64, bool) { return r.eval.cpuPerReq, true }
func plainGetSet(r roundResult) (float64, bool) {
	return r.get.cpuPerReq + r.set.cpuPerReq, true
}

// floorOf is the Redis CPU per request of a run's floor (GET for a replay,
// GET+SET for a first execution), measured interleaved with the run.
func floorOf(key string) func(roundResult) (float64, bool) {
	return runOf(key, func(x runResult) float64 { return x.floor.cpuPerReq })
}

// normalized is a run's Redis CPU per request over its own floor's.
func normalized(key string) func(roundResult) (float64, bool) {
	return runOf(key, func(x runResult) float64 { return x.seq.cpuPerReq / x.floor.cpuPerReq })
}

func one(roundResult) (float64, bool) { return 1, true }

var ratios = []ratio{
	{"Redis CPU/req, idemkey redis replay / GET floor", "<= 1.5", runOf("redis/replay", redisCPU), floorOf("redis/replay")},
	{"Redis CPU/req, idemkey redis first / GET+SET floor", "<= 2.5", runOf("redis/first", redisCPU), floorOf("redis/first")},
	{"Redis CPU/req, idemkey / Fiber+Redis, replay (each over its floor)", "<= 1.2", normalized("redis/replay"), normalized("fiber-redis/replay")},
	{"Redis CPU/req, idemkey / Fiber+Redis, first (each over its floor)", "<= 1.5", normalized("redis/first"), normalized("fiber-redis/first")},
	{"Redis CPU/req, idemkey / Fiber+Redis, replay (raw)", "<= 1.2", runOf("redis/replay", redisCPU), runOf("fiber-redis/replay", redisCPU)},
	{"Redis CPU/req, idemkey / Fiber+Redis, first (raw)", "<= 1.5", runOf("redis/first", redisCPU), runOf("fiber-redis/first", redisCPU)},
	{"req/s, idemkey redis / Fiber+Redis, replay", ">= 1.0", runOf("redis/replay", rps), runOf("fiber-redis/replay", rps)},
	{"req/s, idemkey redis / Fiber+Redis, first", ">= 0.9", runOf("redis/first", rps), runOf("fiber-redis/first", rps)},
	{"req/s, idemkey-fiber-redis / Fiber+Redis, replay (like for like)", ">= 1.0", runOf("idemkey-fiber-redis/replay", rps), runOf("fiber-redis/replay", rps)},
	{"req/s, idemkey-fiber-redis / Fiber+Redis, first (like for like)", ">= 0.9", runOf("idemkey-fiber-redis/first", rps), runOf("fiber-redis/first", rps)},
	{"server CPU/req, idemkey-fiber-redis / Fiber+Redis, replay", "", runOf("idemkey-fiber-redis/replay", cpu), runOf("fiber-redis/replay", cpu)},
	{"server CPU/req, idemkey-fiber-redis / Fiber+Redis, first", "", runOf("idemkey-fiber-redis/first", cpu), runOf("fiber-redis/first", cpu)},
	{"server CPU/req, idemkey redis (net/http) / Fiber+Redis, replay", "", runOf("redis/replay", cpu), runOf("fiber-redis/replay", cpu)},
	{"server CPU/req, idemkey redis (net/http) / Fiber+Redis, first", "", runOf("redis/first", cpu), runOf("fiber-redis/first", cpu)},
	{"added server CPU/req, idemkey-fiber-redis / Fiber+Redis, replay", "", added("idemkey-fiber-redis/replay", "fiber-bare/bare"), added("fiber-redis/replay", "fiber-bare/bare")},
	{"added server CPU/req, idemkey-fiber-redis / Fiber+Redis, first", "", added("idemkey-fiber-redis/first", "fiber-bare/bare"), added("fiber-redis/first", "fiber-bare/bare")},
	{"added server CPU/req, idemkey redis (net/http) / Fiber+Redis, replay", "", added("redis/replay", "bare/bare"), added("fiber-redis/replay", "fiber-bare/bare")},
	{"added server CPU/req, idemkey redis (net/http) / Fiber+Redis, first", "", added("redis/first", "bare/bare"), added("fiber-redis/first", "fiber-bare/bare")},
	{"req/s, idemkey-fiber-memory / Fiber+memory, replay", "", runOf("idemkey-fiber-memory/replay", rps), runOf("fiber-memory/replay", rps)},
	{"req/s, idemkey-fiber-memory / Fiber+memory, first", "", runOf("idemkey-fiber-memory/first", rps), runOf("fiber-memory/first", rps)},
	{"Redis CPU/req, Fiber+Redis replay / GET floor", "", normalized("fiber-redis/replay"), one},
	{"Redis CPU/req, Fiber+Redis first / GET+SET floor", "", normalized("fiber-redis/first"), one},
	{"Redis CPU/req, tiered replay / GET floor", "", normalized("tiered/replay"), one},
	{"Redis CPU/req, idemkey redis replay / plain GET loop", "", runOf("redis/replay", redisCPU), plainGet},
	{"Redis CPU/req, idemkey redis first / plain GET+SET loop", "", runOf("redis/first", redisCPU), plainGetSet},
	{"Redis CPU/req, empty EVALSHA loop / plain SET loop", "", emptyEval, plainSet},
	{"req/s, memory replay / bare", "", runOf("memory/replay", rps), runOf("bare/bare", rps)},
	{"req/s, memory first / bare", "", runOf("memory/first", rps), runOf("bare/bare", rps)},
	{"req/s, redis replay / bare", "", runOf("redis/replay", rps), runOf("bare/bare", rps)},
	{"req/s, redis first / bare", "", runOf("redis/first", rps), runOf("bare/bare", rps)},
	{"req/s, Fiber+Redis replay / Fiber bare", "", runOf("fiber-redis/replay", rps), runOf("fiber-bare/bare", rps)},
	{"req/s, Fiber+Redis first / Fiber bare", "", runOf("fiber-redis/first", rps), runOf("fiber-bare/bare", rps)},
	{"req/s, net/http bare / Fiber bare", "", runOf("bare/bare", rps), runOf("fiber-bare/bare", rps)},
	{"req/s, postgres replay / bare", "", runOf("postgres/replay", rps), runOf("bare/bare", rps)},
	{"req/s, tiered replay / bare", "", runOf("tiered/replay", rps), runOf("bare/bare", rps)},
	{"req/s, Fiber+memory replay / Fiber bare", "", runOf("fiber-memory/replay", rps), runOf("fiber-bare/bare", rps)},
	{"added server CPU/req, memory / Fiber+memory, first", "", added("memory/first", "bare/bare"), added("fiber-memory/first", "fiber-bare/bare")},
	{"added server CPU/req, memory / Fiber+memory, replay", "", added("memory/replay", "bare/bare"), added("fiber-memory/replay", "fiber-bare/bare")},
}

// summarize prints the medians over rounds of each run and of each ratio.
func summarize(all []roundResult) {
	fmt.Printf("\nmedians over %d rounds\n%-27s %9s %11s %9s %9s %9s\n", len(all), "run", "req/s", "cpu-us/req", "redis-us", "seq-us", "floor-us")
	for _, s := range subjects {
		for _, mode := range []string{"bare", "first", "replay"} {
			key := s + "/" + mode
			var r, c, rd, sq, fl []float64
			for _, rr := range all {
				if x, ok := rr.runs[key]; ok {
					r, c = append(r, x.rps), append(c, x.cpuPerReq)
					rd, sq, fl = append(rd, x.redis.cpuPerReq), append(sq, x.seq.cpuPerReq), append(fl, x.floor.cpuPerReq)
				}
			}
			if len(r) > 0 {
				fmt.Printf("%-27s %9.0f %11.1f %9.2f %9.2f %9.2f\n", key, httpload.Median(r), httpload.Median(c), httpload.Median(rd), httpload.Median(sq), httpload.Median(fl))
			}
		}
	}
	var ev []float64
	for _, rr := range all {
		ev = append(ev, rr.eval.cpuPerReq)
	}
	fmt.Printf("%-20s %9s %11s %9s %9.2f\n", "empty EVALSHA loop", "", "", "", httpload.Median(ev))
	var g, st []float64
	for _, rr := range all {
		g, st = append(g, rr.get.cpuPerReq), append(st, rr.set.cpuPerReq)
	}
	fmt.Printf("%-27s %9s %11s %9s %9.2f\n%-27s %9s %11s %9s %9.2f\n", "plain GET loop", "", "", "", httpload.Median(g), "plain SET loop", "", "", "", httpload.Median(st))
	fmt.Printf("\nratios (median of the rounds' ratios)\n")
	for _, q := range ratios {
		var xs []float64
		for _, rr := range all {
			n, ok1 := q.num(rr)
			d, ok2 := q.den(rr)
			if ok1 && ok2 && d != 0 {
				xs = append(xs, n/d)
			}
		}
		if len(xs) == 0 {
			continue
		}
		fmt.Printf("  %-72s %6.2f  %s\n", q.name, httpload.Median(xs), q.target)
	}
}
