#!/usr/bin/env bash
# The main job, end to end on one machine: generate a dataset, start a node
# whose storage is throttled like a network disk, warm the cache with a
# progress bar, read an epoch like a training loader (checking every byte),
# print the statistics and the data-stall analysis. Stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
# Data, raft state and the node's log go to a cache directory outside the
# checkout (git status stays clean); DEMO_DIR puts them elsewhere.
work=${DEMO_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/stallfree/demo}
items=${DEMO_ITEMS:-2000}
size=${DEMO_SIZE:-110KiB}
http=${DEMO_HTTP:-127.0.0.1:7070}
rm -rf "$work"
mkdir -p "$work"
ctl() { bin/cachectl --node "http://$http" "$@"; }

echo "== demo data, raft state and node log in $work (removed and rewritten by each run)"
echo "== generating $items items of ~$size in $work/data"
ctl gendata "$work/data" --items "$items" --size "$size"

echo "== starting cachenode on $http"
host=${http%:*}
bin/cachenode --name demo-node --http "$http" --raft "${DEMO_RAFT:-$host:17072}" --peer "${DEMO_PEER:-$host:17071}" \
  --gossip "${DEMO_GOSSIP:-$host:17946}" \
  --bootstrap --data-dir "$work/state" --memory 512MiB --timing local --log-level warn --source-rate 150MB \
  --dataset "demo=$(cd "$work/data" && pwd)" 2>"$work/node.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  if ctl datasets ls 2>/dev/null | grep -q '^demo '; then break; fi
  kill -0 $pid 2>/dev/null || { cat "$work/node.log"; exit 1; }
  sleep 0.1
done
ctl datasets ls

echo "== warm-up"
ctl warmup demo

echo "== one epoch in random order, 8 workers, every byte checked against the files"
ctl epoch demo --epochs 1 --workers 8 --verify "$work/data"

echo "== stats"
ctl stats
echo "(source reads = items: every item was read from storage exactly once)"

echo "== data-stall analysis (storage throttled to 150 MB/s; a GPU consuming 2500 images/s)"
ctl analyze demo --gpu-rate 2500
