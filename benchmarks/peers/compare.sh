#!/bin/sh
# compare.sh runs benchmarks/peers for two versions of the repository,
# interleaved, and prints what the middleware adds next to Fiber v2, per version:
#
#	benchmarks/peers/compare.sh [OLD_REV] [ROUNDS]
#
# OLD_REV (default main) is built from `git archive` into a temporary directory,
# the new version from the working tree; both test binaries are built once, then
# run ROUNDS times (default 10) in turn, old, new, old, new, ..., at a 128-byte
# and at a 1 KiB request body (BenchmarkIdemkey, BenchmarkFiberV2 and
# BenchmarkParts, 200,000 iterations each, -count 1 per run), so that a change
# of load on a shared machine affects both alike. It prints, per version and
# body size, the medians of cpu-ns/op (the process's CPU time per request), the
# added cost (first or replay minus bare) of ours and of Fiber v2, their ratio
# (ours / Fiber's; 1.00 is as cheap as Fiber), and allocs/op. The raw outputs
# stay in $OUT (default a new temporary directory; its path is printed), for
# benchstat when it is installed: benchstat $OUT/old-128.txt $OUT/new-128.txt.
#
# With LOOPBACK=1 it then runs benchmarks/loopback (the working tree's program,
# built against each version's packages) for each version in turn, ROUNDS times
# one round at a 1 KiB body, and prints each run's lines: requests/s and server
# CPU per request of bare, first and replay, and their ratios to bare.
set -eu

old=${1:-main}
rounds=${2:-10}
root=$(git rev-parse --show-toplevel)
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
echo "raw outputs in $out"

src="$out/src-old"
rm -rf "$src"
mkdir -p "$src"
git -C "$root" archive "$old" | tar -x -C "$src"
(cd "$src/benchmarks" && go test -c -o "$out/old.test" ./peers/)
(cd "$root/benchmarks" && go test -c -o "$out/new.test" ./peers/)

for size in 128 1024; do
	: >"$out/old-$size.txt"
	: >"$out/new-$size.txt"
done
i=0
while [ "$i" -lt "$rounds" ]; do
	i=$((i + 1))
	for size in 128 1024; do
		for v in old new; do
			"$out/$v.test" -test.run '^$' -test.bench 'Idemkey|FiberV2|Parts' -test.benchtime 200000x \
				-test.count 1 -peers.body="$size" | grep '^Benchmark' >>"$out/$v-$size.txt"
		done
	done
	echo "round $i of $rounds done"
done

# summary FILE: medians of cpu-ns/op and allocs/op per benchmark, and the added
# cost of ours against Fiber v2's.
summary() {
	awk '
	{
		name = $1; sub(/-[0-9]+$/, "", name)
		for (i = 3; i < NF; i++) {
			if ($(i+1) == "cpu-ns/op") cpu[name] = cpu[name] " " $i
			if ($(i+1) == "allocs/op") allocs[name] = $i
		}
	}
	function median(s,   a, n, i, j, t) {
		n = split(s, a, " ")
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	END {
		for (n in cpu) m[n] = median(cpu[n])
		printf "  %-32s %10s %8s\n", "benchmark", "cpu-ns/op", "allocs"
		for (n in cpu) printf "  %-32s %10.0f %8s\n", n, m[n], allocs[n] | "sort"
		close("sort")
		for (p = 1; p <= 2; p++) {
			path = p == 1 ? "first" : "replay"
			ours = m["BenchmarkIdemkey/" path] - m["BenchmarkIdemkey/bare"]
			fib = m["BenchmarkFiberV2/" path] - m["BenchmarkFiberV2/bare"]
			printf "  added on %-6s ours %6.0f ns, Fiber v2 %6.0f ns, ratio %.2f\n", path, ours, fib, ours / fib
		}
	}' "$1"
}

for size in 128 1024; do
	for v in old new; do
		echo "$v ($([ $v = old ] && echo "$old" || echo "working tree")), body $size B:"
		summary "$out/$v-$size.txt"
	done
done
if command -v benchstat >/dev/null; then
	for size in 128 1024; do benchstat "$out/old-$size.txt" "$out/new-$size.txt"; done
fi

if [ "${LOOPBACK:-0}" = 1 ]; then
	rm -rf "$src/benchmarks/loopback"
	cp -r "$root/benchmarks/loopback" "$src/benchmarks/loopback"
	(cd "$src/benchmarks" && go build -o "$out/loopback-old" ./loopback/)
	(cd "$root/benchmarks" && go build -o "$out/loopback-new" ./loopback/)
	i=0
	while [ "$i" -lt "$rounds" ]; do
		i=$((i + 1))
		for v in old new; do
			echo "loopback $v, run $i:"
			"$out/loopback-$v" -rounds 1 -d 2s -c 4 -body 1024 | sed -n '3,5p'
		done
	done
fi
