"""What a loader's forked worker process sets up before its first batch."""

import sys


def one_intraop_thread():
    """Leaves torch one thread for its own ops in this worker, as
    DataLoader's workers do. A worker inherits the parent's intra-op pool
    (one thread a core): with 12 workers on 16 cores, each transform's
    ``ToTensor`` and ``Normalize`` then fanned out to 16 threads, 192
    runnable where 16 can run (a 1-minute load above 50 in BENCHMARKS.md's
    H200 run of BatchLoader), and the batches came slower than from a
    DataLoader with the same workers. Without torch loaded, nothing to do."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
