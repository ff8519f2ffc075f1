#!/usr/bin/env python3
"""Sends a node's gossip port what a party without the cluster key can send:
N connections, each an encrypted-stream header declaring SIZE bytes and that
many bytes (less 1 MiB), held HOLD seconds, from SOURCES loopback addresses in
turn. Read the node's peak memory before and after (grep VmHWM
/proc/PID/status). Loopback only, bounded in count and time: the figure of
docs/operations.md ("What a party without the key costs a node").

    scripts/gossip-flood.py PORT [N=200] [HOLD=12] [SIZE=2097152] [SOURCES=8]
"""
import os
import socket
import struct
import sys
import threading
import time


def main():
    port = int(sys.argv[1])
    n, hold, size, sources = (int(a) for a in (sys.argv[2:] + ["200", "12", "2097152", "8"][len(sys.argv) - 2:])[:4])
    if not (0 < n <= 1000 and 0 <= hold <= 60 and 0 < size < 1 << 32 and 0 < sources <= 250):
        sys.exit("want N in 1..1000, HOLD in 0..60 s, SIZE below 4 GiB, SOURCES in 1..250")
    chunk = os.urandom(1 << 20)
    refused = [0]

    def one(i):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=hold + 10,
                                         source_address=("127.0.0.%d" % (2 + i % sources), 0))
            s.sendall(bytes([10]) + struct.pack(">I", size))  # memberlist's encryptMsg and a length
            sent = 0
            while sent < size - len(chunk):
                s.sendall(chunk)
                sent += len(chunk)
            time.sleep(hold)
            s.close()
        except OSError:
            refused[0] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("%d of %d connections refused before they were through" % (refused[0], n))


if __name__ == "__main__":
    main()
