"""One training rank for ResumeTest: reads its epoch through a DataLoader with
worker processes, logs each consumed sample, saves a checkpoint after a given
batch and, if told to, then waits to be killed. Started again with the same
checkpoint file, it resumes from it.

    resume_rank.py URL DATASET JOB RANK EPOCH CHECKPOINT LOG CHECKPOINT_AT WAIT_AFTER
"""

import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch.utils.data  # noqa: E402

from stallfree.torch import CachedDataset, LocalitySampler  # noqa: E402

BATCH = 8


class Indexed(CachedDataset):
    """Samples with their indices, so the log can say which were consumed."""

    def __getitems__(self, indices):
        return list(zip(indices, super().__getitems__(indices)))


def main():
    url, dataset, job, rank, epoch, ckpt, log, checkpoint_at, wait_after = sys.argv[1:]
    checkpoint_at, wait_after = int(checkpoint_at), int(wait_after)
    sampler = LocalitySampler(url, job, int(rank))
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            sampler.load_state_dict(json.load(f)["sampler"])
    sampler.set_epoch(int(epoch))
    # Two workers, four batches each ahead: the sampler hands out far more
    # indices than the loop has consumed when the checkpoint is taken.
    loader = torch.utils.data.DataLoader(Indexed(url, dataset), batch_size=BATCH, sampler=sampler, num_workers=2,
                                         prefetch_factor=4, collate_fn=list)
    consumed = 0
    with open(log, "a") as out:
        for b, batch in enumerate(loader, start=1):
            for i, data in batch:
                out.write(json.dumps([int(i), hashlib.sha256(data).hexdigest()]) + "\n")
            out.flush()
            consumed += len(batch)
            if b == checkpoint_at:
                tmp = ckpt + ".tmp"
                state = sampler.state_dict(consumed=consumed)
                with open(tmp, "w") as f:
                    json.dump({"sampler": state}, f)
                os.replace(tmp, ckpt)
                sampler.report(state)  # cachectl jobs ls shows it
                out.write("CHECKPOINT\n")
                out.flush()
            if b == wait_after:
                print("WAITING", flush=True)
                time.sleep(600)  # the test kills this process here
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
