#!/usr/bin/env python3
"""What a fresh page costs on this machine, in CPU µs per 4 KiB page.

On a VM whose balloon reports free pages (virtio free page reporting), the
guest gives memory it frees back to the host within seconds, and touching it
again faults in the host as well as in the guest: the cost depends on how long
ago the memory was freed. Every row that allocates fresh memory in the benches
scatters with that (BENCHMARKS.md, "Fresh memory on a VM").

    /usr/bin/python3 scripts/fresh-memory.py [--mib 256] [--pause 5] [--rounds 3] [--small-pages]

Rows: anonymous memory freed a moment before and touched again; the same after
a pause; a new memfd written (the node's arena, a staged batch); the same
memfd written again. numpy asks for transparent huge pages for large arrays
(MADV_HUGEPAGE), so the anonymous rows fault 2 MiB at a time where THP is on
("madvise" or "always"); --small-pages stops it asking. A memfd gets 4 KiB
pages unless shmem_enabled allows more. Needs numpy."""
import argparse
import mmap
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from stallfree.bench.common import cpu_model, memory_note  # noqa: E402

PAGE = 4096


def per_page(fn, size):
    c0 = time.process_time()
    fn()
    return (time.process_time() - c0) / (size / PAGE) * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256, help="bytes written per row, in MiB")
    p.add_argument("--pause", type=float, default=5.0, help="seconds between a free and the next touch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--small-pages", action="store_true", help="anonymous memory without MADV_HUGEPAGE")
    a = p.parse_args()
    if a.small_pages:
        np.core.multiarray._set_madvise_hugepage(False)
    size = a.mib << 20
    src = np.ones(size, np.uint8)
    print(f"{cpu_model()}, {os.cpu_count()} CPUs{'; ' + memory_note() if memory_note() else ''}; "
          f"{a.mib} MiB a row, CPU µs per 4 KiB page; anonymous memory {'without' if a.small_pages else 'with'} "
          f"MADV_HUGEPAGE")
    print("| round | anon, freed a moment before | anon, after a pause | new memfd | memfd written again |")
    print("|---|---|---|---|---|")
    for r in range(a.rounds):
        warm = np.empty(size, np.uint8)
        warm[:] = src
        del warm  # freed now: the next allocation may get these pages back

        def anon():
            b = np.empty(size, np.uint8)
            b[:] = src
        again = per_page(anon, size)
        time.sleep(a.pause)
        paused = per_page(anon, size)
        fd = os.memfd_create("fresh-memory")
        try:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size) as m:
                view = np.frombuffer(m, np.uint8)
                new = per_page(lambda: view.__setitem__(slice(None), src), size)
                rewritten = per_page(lambda: view.__setitem__(slice(None), src), size)
                del view
        finally:
            os.close(fd)
        print(f"| {r + 1} | {again:.2f} | {paused:.2f} | {new:.2f} | {rewritten:.2f} |")


if __name__ == "__main__":
    main()
