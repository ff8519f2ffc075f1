#!/usr/bin/env bash
# Mutation testing of the core packages with gremlins
# (github.com/go-gremlins/gremlins): each covered mutant is compiled into
# its package and the package's tests run against it. Writes one JSON per
# package and a table (killed / lived / not covered / efficacy / mutator
# coverage) to $OUT/summary.md, and lists every mutant that lived.
#   scripts/mutate.sh [PKG...]     default: the core packages
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-mutate-out}
GREMLINS_VERSION=${GREMLINS_VERSION:-v0.6.0}
GOBIN_DIR=${GOBIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/stallfree/gremlins-$GREMLINS_VERSION}
if [ ! -x "$GOBIN_DIR/gremlins" ]; then
	echo "building gremlins $GREMLINS_VERSION into $GOBIN_DIR"
	GOBIN=$GOBIN_DIR CGO_ENABLED=0 go install "github.com/go-gremlins/gremlins/cmd/gremlins@$GREMLINS_VERSION"
fi
pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=(store locality partition transport catalog source clusterauth listen node control relay cluster clairvoyant)
mkdir -p "$OUT"
for p in "${pkgs[@]}"; do
	start=$(date +%s)
	# gremlins mutates the working tree in place under a copy; a private
	# GOCACHE keeps its builds out of the developer's cache. It is warmed
	# with the package's test build first: gremlins times each mutant's run
	# against its coverage run, and the first mutants would otherwise pay
	# for compiling every dependency without coverage and time out. With a
	# warm cache the coverage run is short, so the coefficient is generous:
	# a mutant that runs slower on a busy machine is not a hang.
	cache=$(mktemp -d)
	GOCACHE=$cache go test -count=1 -run '^$' "./$p" >/dev/null
	GOCACHE=$cache "$GOBIN_DIR/gremlins" unleash "./$p" --workers 2 --timeout-coefficient 10 -S lt -o "$OUT/$p.json" >"$OUT/$p.log" 2>&1 || true
	rm -rf "$cache"
	echo "$p: $(grep -E '^(Killed|Test efficacy|Mutator coverage)' "$OUT/$p.log" | tr '\n' ' ') ($(( $(date +%s) - start )) s)"
done
python3 - "$OUT" "${pkgs[@]}" <<'PY'
import json, sys, os
out, pkgs = sys.argv[1], sys.argv[2:]
rows = ["| package | killed | lived | not covered | timed out | efficacy | mutator coverage |", "|---|---:|---:|---:|---:|---:|---:|"]
lived = []
for p in pkgs:
    try:
        r = json.load(open(os.path.join(out, p + ".json")))
    except (OSError, ValueError) as e:
        rows.append(f"| {p} | (no result: {e}) | | | | | |")
        continue
    rows.append(f"| {p} | {r.get('mutants_killed',0)} | {r.get('mutants_lived',0)} | {r.get('mutants_not_covered',0)} | {r.get('mutants_timed_out',0)} | {r.get('test_efficacy',0):.1f}% | {r.get('mutations_coverage',0):.1f}% |")
    for f in r.get("files", []):
        for m in f.get("mutations", []):
            if m["status"] == "LIVED":
                lived.append(f"{p}/{f['file_name']}:{m['line']}:{m['column']} {m['type']}")
text = "\n".join(rows) + "\n\nLived:\n" + "\n".join(sorted(lived)) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
print(text)
PY
