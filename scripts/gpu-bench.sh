#!/usr/bin/env bash
# The figures issues 48 and 49 ask of a 16-core GPU machine, in one bounded
# run that fits a lent machine's 15 minutes (docs/device.md): the training
# loop (--train), the loader rows (b/a, d/a) and coordinated prep
# (--group 4,8). Each bench has its own time limit, so that one that hangs
# or fails leaves the others' figures. Needs bin/cachenode built (make build;
# the machine needs no Go) and python3 with torch, torchvision, Pillow,
# numpy and msgpack.
#
# Usage: scripts/gpu-bench.sh OUTDIR [ITEMS]   (ITEMS: the --train JPEGs, 25600 as in issue 48)
# Writes OUTDIR/machine.txt and a .json (figures) and .log (progress) per bench.
set -u
out=$(realpath -m "${1:?usage: scripts/gpu-bench.sh OUTDIR [ITEMS]}")
items=${2:-25600}
py=${PYTHON:-python3}
mkdir -p "$out"
cd "$(dirname "$0")/../python" || exit 1
export PYTHONUNBUFFERED=1

{
	date -u
	nproc
	uptime
	nvidia-smi -L
	$py -c 'import sys, torch, torchvision, numpy, msgpack, PIL; print(sys.version.split()[0], "torch", torch.__version__, "torchvision", torchvision.__version__, "numpy", numpy.__version__, "Pillow", PIL.__version__, "cuda", torch.cuda.is_available())'
	df -h /dev/shm /tmp
} >"$out/machine.txt" 2>&1

bench() { # NAME LIMIT_S ARGS...: one bench, its figures and its progress apart
	local name=$1 limit=$2
	shift 2
	echo "$(date -u +%T) $name (load: $(cut -d' ' -f1-3 /proc/loadavg)): $*"
	timeout "$limit" "$py" -W ignore -m stallfree.bench "$@" --json >"$out/$name.json" 2>"$out/$name.log"
	echo "$(date -u +%T) $name exit $?"
}

bench train 300 --train --items "$items" --delivery-epochs 3
bench loader 110 --items 12000 --rounds 2
bench group 150 --group 4,8
