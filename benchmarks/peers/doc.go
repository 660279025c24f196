// Package peers measures what the idempotency middleware adds to a request, against
// the peers a Go user can pick from the module proxy: Fiber's idempotency middleware
// (v2 and v3, on fasthttp). Each framework is measured bare and behind its
// middleware, on the same handler (read a JSON body, 1 KiB unless -peers.body says
// otherwise, answer 201 with a small
// JSON document), in one run:
//
//	go test -run '^$' -bench . -count 6 ./benchmarks/peers/ | benchstat -
//	go test -run '^$' -bench . -count 6 ./benchmarks/peers/ -args -peers.body=128 | benchstat -
//
// The figure that compares across frameworks is the added cost, the middleware's time
// minus its framework's bare time, on the first execution of a key (a new key every
// request, records kept in memory) and on a replay. The peers keep their defaults
// except the key header (Idempotency-Key) and a lifetime of 24 h, as ours.
package peers
