#!/usr/bin/env bash
# Installs the Debian packages `make test` needs when they are missing:
# a C toolchain for `go test -race` and the Python loader's torch, msgpack,
# numpy and Pillow for Debian's own python3. As root it runs apt-get; otherwise it
# stops and prints the one command that would.
# Usage: test-deps.sh PYTHON PACKAGE...
set -euo pipefail
python=$1; shift
missing=()
for pkg in "$@"; do
  case $pkg in
    gcc) command -v gcc >/dev/null || missing+=(gcc) ;;
    libc6-dev) [ -e /usr/include/stdio.h ] || missing+=(libc6-dev) ;;
    python3-pil) "$python" -c "import PIL.Image" 2>/dev/null || missing+=("$pkg") ;;   # Pillow imports as PIL
    python3-*) "$python" -c "import ${pkg#python3-}" 2>/dev/null || missing+=("$pkg") ;;
    *) dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg") ;;
  esac
done
((${#missing[@]})) || exit 0
# Another apt or dpkg run (unattended-upgrades on a fresh VM, a second
# terminal) holds the dpkg lock for minutes: wait for it, up to 10 minutes,
# instead of failing after apt's default few seconds.
lock="-o DPkg::Lock::Timeout=${STALLFREE_APT_LOCK_TIMEOUT:-600}"
cmd="apt-get $lock update -qq && DEBIAN_FRONTEND=noninteractive apt-get $lock install -y -qq --no-install-recommends ${missing[*]}"
if [ "$(id -u)" != 0 ]; then
  echo "make test needs: ${missing[*]}. Install them with:" >&2
  echo "  sudo sh -c '$cmd'" >&2
  exit 1
fi
echo "== installing what make test needs: ${missing[*]}"
sh -c "$cmd"
