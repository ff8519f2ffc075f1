#!/usr/bin/env bash
# Creates the compose file's secrets in DIR (default .cluster): the HTTP token,
# the cluster key, and MinIO's root user and password, also as an AWS shared
# credentials file. Generated once, kept out of git and out of the images. The
# directory is private; the files are readable so the unprivileged containers
# can read their bind-mounted copies.
set -euo pipefail
dir=${1:-.cluster}
mkdir -p "$dir" && chmod 700 "$dir"
rand() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }
[ -s "$dir/token" ] || rand 24 > "$dir/token"
[ -s "$dir/cluster.key" ] || rand 32 > "$dir/cluster.key"
if [ ! -s "$dir/s3-credentials" ]; then
  user="stallfree-$(rand 4)"
  pass=$(rand 20)
  printf '%s' "$user" > "$dir/s3-user"
  printf '%s' "$pass" > "$dir/s3-password"
  printf '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$user" "$pass" > "$dir/s3-credentials"
fi
chmod 644 "$dir"/token "$dir"/cluster.key "$dir"/s3-user "$dir"/s3-password "$dir"/s3-credentials
