#!/usr/bin/env bash
# Removes what the multi-host testbed (integration/testbed_test.go) creates,
# for when a test process died before its own cleanup ran: namespaces named
# sfh*-h*, with whatever still runs in them, the hosts' outer veths sfh*h*
# (a namespace no longer named can outlive its deletion while the kernel
# still holds it, and its veth with it), bridges named sfh*br and their
# iptables FORWARD rules.
set -uo pipefail
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^sfh[0-9a-f]+-h[0-9]+$/ {print $1}'); do
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  ip netns del "$ns"
done
for veth in $(ip -o link show type veth 2>/dev/null | awk -F': ' '$2 ~ /^sfh[0-9a-f]+h[0-9]+@/ {sub(/@.*/, "", $2); print $2}'); do
  ip link del "$veth"
done
for br in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '$2 ~ /^sfh[0-9a-f]+br/ {sub(/@.*/, "", $2); print $2}'); do
  ip link del "$br"
done
# The FORWARD rules that let their bridged traffic through.
if command -v iptables >/dev/null; then
  iptables -S FORWARD 2>/dev/null | grep -E -- '-i sfh[0-9a-f]+br -o sfh[0-9a-f]+br -j ACCEPT' | while read -r _ rule; do
    iptables -D $rule
  done
fi
exit 0
