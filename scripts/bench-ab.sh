#!/usr/bin/env bash
# Runs one Python bench in this checkout (new) and in a worktree of an older
# commit (old), alternately (new first in odd rounds, old first in even
# ones), each run started only once the 1-minute load average is below LOAD
# (default 1.0): a figure taken on a loaded machine is not a figure, and two
# builds compared must share the machine.
#   scripts/bench-ab.sh OLD_COMMIT [ROUNDS] -- BENCH ARGS...
# e.g. scripts/bench-ab.sh 7701d75 2 -- --group 4,8 --epochs 6
# The worktree lives in a temporary directory and is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: $0 OLD_COMMIT [ROUNDS] -- BENCH ARGS...}
shift
rounds=2
if [ "${1:-}" != "--" ]; then rounds=${1:-2}; shift || true; fi
[ "${1:-}" = "--" ] && shift
limit=${LOAD:-1.0}
tree=$(mktemp -d)
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"' EXIT
git worktree add -q --detach "$tree" "$old"
make -s build
(cd "$tree" && make -s build)
# The sides swap places each round: always running new first made it look
# 5-11% dearer in rows its change did not touch (BENCHMARKS.md, "Dropped
# batches' files"), perhaps because on a VM that gives idle memory back to
# its host the first run after a quiet wait pays for it.
for ((i = 1; i <= rounds; i++)); do
	order="new old"
	((i % 2)) || order="old new"
	for side in $order; do
		dir=.
		[ "$side" = old ] && dir=$tree
		while awk -v l="$limit" '{exit !($1 >= l)}' /proc/loadavg; do sleep 5; done
		echo "== $side ($( [ "$side" = old ] && echo "$old" || git rev-parse --short HEAD)) $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
		(cd "$dir/python" && /usr/bin/python3 -W ignore -m stallfree.bench "$@")
	done
done
