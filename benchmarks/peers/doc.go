// Package peers measures what the idempotency middleware adds to a request, against
// the peers a Go user can pick from the module proxy: Fiber's idempotency middleware
// (v2 and v3, on fasthttp). Each framework is measured bare and behind its
// middleware, on the same handler (read a JSON body, 1 KiB unless -peers.body says
// otherwise, and answer 201 with a small JSON document), in one run:
//
//	go test -run '^$' -bench . -benchtime 200000x -count 10 ./benchmarks/peers/ | benchstat -
//	go test -run '^$' -bench . -benchtime 200000x -count 10 ./benchmarks/peers/ -args -peers.body=128 | benchstat -
//
// The iteration count is fixed because the first-execution benchmarks keep every
// record (a new key every request, none expires during the run), so the stores' size,
// and with it their cost, grows with the number of iterations.
//
// The figure that compares across frameworks is the added cost, the middleware's time
// minus its framework's bare time, on the first execution of a key and on a replay.
// Each benchmark also reports cpu-ns/op, the process's CPU time per iteration (on
// Unix): on a machine shared with other work the wall time (ns/op) also counts the
// time spent waiting for a core, the CPU time only the work done (the garbage
// collector's included); compare the two and trust cpu-ns/op when they differ.
// The peers keep their defaults except the key header (Idempotency-Key) and a
// lifetime of 24 h, as ours. BenchmarkHash gives the fingerprint's own cost (SHA-256
// of the body) in the same run, and BenchmarkParts splits ours further: the memory
// store's own calls (store/first, store/replay) and the middleware over a store that
// costs nothing (nullstore/first).
//
// compare.sh runs these benchmarks for two versions of the repository in turn
// (an old revision, main by default, and the working tree) and prints the
// medians and the ratios to Fiber v2's added cost of each:
//
//	benchmarks/peers/compare.sh main 10
package peers
