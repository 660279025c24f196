#!/bin/sh
# compare.sh runs benchmarks/endtoend for two versions of the repository, in
# turn, one round each, ROUNDS times, on one private Redis, so that a change of
# load on a shared machine affects both alike:
#
#	benchmarks/endtoend/compare.sh [OLD_REV] [ROUNDS] [-- ENDTOEND FLAGS]
#
# OLD_REV (default main) is built from `git archive` with the working tree's
# benchmarks/endtoend copied in (the program uses only public APIs); the new
# version is the working tree. Flags after -- go to both (for example
# -body 1024 -pg "$DATABASE_URL" -only redis,fiber-redis,get,getset). Each
# run's output stays in $OUT (default a new temporary directory; its path is
# printed); the ratios of each run are printed as they come.
set -eu

old=${1:-main}
rounds=${2:-4}
shift 2 2>/dev/null || shift $#
[ "${1:-}" = "--" ] && shift
root=$(git rev-parse --show-toplevel)
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
echo "raw outputs in $out"

src="$out/src-old"
rm -rf "$src"
mkdir -p "$src"
git -C "$root" archive "$old" | tar -x -C "$src"
rm -rf "$src/benchmarks/endtoend"
cp -r "$root/benchmarks/endtoend" "$src/benchmarks/endtoend"
cp "$root/benchmarks/go.mod" "$root/benchmarks/go.sum" "$src/benchmarks/"
(cd "$src/benchmarks" && go build -o "$out/endtoend-old" ./endtoend/)
(cd "$root/benchmarks" && go build -o "$out/endtoend-new" ./endtoend/)

# One private Redis for both versions.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$out" \
	--maxmemory-policy noeviction >"$out/redis.log" 2>&1 &
redis_pid=$!
trap 'kill $redis_pid' EXIT INT TERM
sleep 0.5

i=0
while [ "$i" -lt "$rounds" ]; do
	i=$((i + 1))
	for v in old new; do
		"$out/endtoend-$v" -rounds 1 -redis "127.0.0.1:$port" "$@" >"$out/$v-$i.txt"
		echo "== $v ($([ $v = old ] && echo "$old" || echo "working tree")), round $i"
		sed -n '/^ratios/,$p' "$out/$v-$i.txt"
	done
done
