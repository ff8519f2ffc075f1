#!/usr/bin/env bash
# The figures issues 48 and 49 ask of a 16-core GPU machine, in one bounded
# run that fits a lent machine's 15 minutes (docs/device.md): the training
# loop (--train), the loader rows (b/a, d/a) and coordinated prep
# (--group 4,8), and --micro. Each bench has its own time limit, so that one that hangs
# or fails leaves the others' figures. Needs bin/cachenode built (make build;
# the machine needs no Go) and python3 with torch, torchvision, Pillow,
# numpy and msgpack.
#
# Usage: scripts/gpu-bench.sh OUTDIR [ITEMS]   (ITEMS: the --train JPEGs, 25600 as in issue 48)
# Environment: BENCHES (train,loader,micro,group: which to run, in that order;
# a lease too short for all of them runs them in two calls), TRAIN_ROWS (--train's --rows), DELIVERY_EPOCHS (3), GROUP_EPOCHS (6), MICRO (1; 0 skips --micro),
# QUIET_S (90: the longest wait for a quiet machine between benches),
# GROUP_JOBS (4,8: the group bench's J; not GROUPS, which bash sets to the user's groups), GROUP_ROWS (every row), GROUP_QUIET_S (0:
# the longest wait for a load below 2 before each group row; after a row of 8
# jobs the 1-minute load stays above 2 for a minute or more, so a J = 8 row
# that starts at once is no figure. Each row may add up to that much).
# Limits: train 360 s (making 25,600 JPEGs, then every row; device-prep's
# first epoch fills a prep stage of its own since the sixth session, ~10-45 s
# more), loader 110 s. Writes OUTDIR/machine.txt and a .json (figures) and
# .log (progress) per bench.
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
	# A VM whose page tables the hypervisor shadows (PVM) makes every fresh
	# mapping dear, and a VM with free page reporting every fresh page:
	# BENCHMARKS.md, "Dropped batches' files".
	dmesg 2>/dev/null | grep -m2 -i -E "hypervisor detected|pvm" # may be restricted: lscpu too
	lscpu 2>/dev/null | grep -i -E "hypervisor|virtuali"
	cat /sys/bus/virtio/devices/*/features 2>/dev/null
} >"$out/machine.txt" 2>&1

benches=",${BENCHES:-train,loader,micro,group},"
ran=0    # whether a bench ran since the last wait for quiet
status=0 # the script's: 1 once any bench failed or was killed
bench() { # NAME LIMIT_S ARGS...: one bench, its figures and its progress apart
	local name=$1 limit=$2
	shift 2
	case $benches in *",$name,"*) ran=1 ;; *) return 0 ;; esac
	echo "$(date -u +%T) $name (load: $(cut -d' ' -f1-3 /proc/loadavg)): $*"
	timeout "$limit" "$py" -W ignore -m stallfree.bench "$@" --json >"$out/$name.json" 2>"$out/$name.log"
	local rc=$? # before any command substitution below, which sets $? anew
	[ "$rc" = 0 ] || status=1
	echo "$(date -u +%T) $name exit $rc$([ "$rc" = 124 ] && echo " (killed at its limit of $limit s)")"
}

quiet() { # waits (at most $1 s) for a 1-minute load below 2: the last bench's processes weigh on it for a minute
	[ "$ran" = 1 ] || return 0 # no bench since the last wait: no load of ours to wait out
	ran=0
	local end=$((SECONDS + $1))
	while [ "$SECONDS" -lt "$end" ] && awk '{exit !($1 >= 2)}' /proc/loadavg; do sleep 2; done
}

bench train 360 --train --items "$items" --rows "${TRAIN_ROWS:-files,cached,batchloader,prep,device-prep,device-jpeg}" \
	--delivery-epochs "${DELIVERY_EPOCHS:-3}"
quiet "${QUIET_S:-90}"
bench loader 110 --items 12000 --rounds 2
quiet "${QUIET_S:-90}"
# What a fresh mapping, a memfd write and a prep step cost here (one
# process, about a minute; MICRO=0 skips it): the figures that tell this
# machine's memory from the 2-core VM's.
[ "${MICRO:-1}" = 0 ] || bench micro 90 --micro --copy-mb 256 --writes 50 --images 64 --rounds 1
gq=${GROUP_QUIET_S:-0}
bench group $((150 + 10 * ${gq%.*})) --group "${GROUP_JOBS:-4,8}" --epochs "${GROUP_EPOCHS:-6}" --quiet-wait "$gq" \
	--rows "${GROUP_ROWS:-independent,staging,hand-off,prep-fill,prep-cache}"
exit $status
