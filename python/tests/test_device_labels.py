"""labels="folder" and labels=fn(key) (stallfree.labels) against a real
node: ImageFolder's numbering, worked out from a few key reads, on
CachedDataset, BatchLoader and CoordinatedLoader."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from stallfree import Client  # noqa: E402
from stallfree.labels import Labels, folder_of  # noqa: E402
from stallfree.torch import BatchLoader, CachedDataset, CoordinatedLoader  # noqa: E402

from harness import Cluster, ClusterCase, wait_until  # noqa: E402

# Classes of uneven sizes; "a-b" sorts after "a" as a name but its keys come
# first in the manifest ('-' < '/'); "a/sub/..." still belongs to "a".
LAYOUT = [("a-b", 1), ("a", 37), ("a/sub", 5), ("b", 2), ("zeta", 60)]


def key_of(i):
    for folder, count in LAYOUT:
        if i < count:
            return f"{folder}/k{i:03d}"
        i -= count


N = sum(c for _, c in LAYOUT)
CLASSES = ["a", "a-b", "b", "zeta"]


def count_index_reads(client):
    seen = []
    request = client.request

    def counting(method, path, *a, **kw):
        if "/index/" in path:
            seen.append(path)
        return request(method, path, *a, **kw)
    client.request = counting
    return seen


class LabelsTest(ClusterCase):
    def setUp(self):
        self.make_tmp("stallfree-labels")
        self.write_files(N, 3, key_of, 10, 20)
        self.cluster = Cluster(self.tmp, n=1)
        self.url = self.cluster.nodes[0][1]
        c = Client(self.url)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        self.want = [CLASSES.index(folder_of(k)) for k in self.keys]

    def test_folder_numbering_from_few_reads(self):
        c = Client(self.url)
        reads = count_index_reads(c)
        labels = Labels("folder", c, "ds")
        self.assertEqual(labels.classes, CLASSES)
        self.assertEqual(labels.of(range(N)).tolist(), self.want)
        self.assertEqual(labels.of([N - 1, 0, 40]).tolist(), [self.want[N - 1], self.want[0], self.want[40]])
        self.assertLessEqual(len(reads), 40, "a bisection, not a read per item")
        self.assertFalse(labels.needs_keys)

    def test_root_files_and_bad_specs_are_refused(self):
        with open(os.path.join(self.data, "loose.bin"), "wb") as f:
            f.write(b"x")
        c = Client(self.url)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds2", {"source": self.data}), 30, "registration")
        with self.assertRaisesRegex(ValueError, "loose.bin"):
            Labels("folder", c, "ds2")
        with self.assertRaisesRegex(ValueError, "tar dataset"):
            Labels("folder", c, "ds", tar=True)
        with self.assertRaisesRegex(ValueError, "folders"):
            Labels("folders", c, "ds")
        with self.assertRaises(ValueError):
            CachedDataset(self.url, "ds", labels="folder", with_key=True)

    def test_cached_dataset(self):
        fn = lambda k: len(k)  # noqa: E731
        for labels, want in (("folder", self.want), (fn, [len(k) for k in self.keys])):
            ds = CachedDataset(self.url, "ds", labels=labels, transform=len)
            order = [70, 3, 0, 104, 38]
            self.assertEqual(ds.__getitems__(order), [(len(self.files[self.keys[i]]), want[i]) for i in order])
            self.assertEqual(ds[41], (len(self.files[self.keys[41]]), want[41]))
            loader = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2)
            ys = torch.cat([y for _, y in loader]).tolist()
            self.assertEqual(ys, want, "through DataLoader workers (the table is pickled with the dataset)")

    def test_batch_loader(self):
        ds = CachedDataset(self.url, "ds")
        order = list(range(N))[::-1]
        for labels, want in (("folder", self.want), (lambda k: len(k), [len(k) for k in self.keys])):
            loader = BatchLoader(ds, 16, sampler=order, threads=2, collate_fn=list, labels=labels)
            got = list(loader)
            self.assertEqual([x for b, _ in got for x in b], [self.files[self.keys[i]] for i in order])
            self.assertEqual(torch.cat([y for _, y in got]).tolist(), [want[i] for i in order])
            self.assertEqual(got[0][1].dtype, torch.int64)

    def test_coordinated_loader(self):
        for workers in (0, 2):  # prepared in this process, then in worker processes
            loader = CoordinatedLoader(self.url, f"g{workers}", 0, "ds", batch_size=16, num_workers=workers, jobs=1,
                                       seed=4, labels="folder", collate_fn=list)
            try:
                got = list(loader)
                self.assertEqual(len(got), len(loader))
                for b, (x, y) in enumerate(got):
                    idx = loader.indices(0, b)
                    self.assertEqual(x, [self.files[self.keys[i]] for i in idx])
                    self.assertEqual(y.tolist(), [self.want[i] for i in idx])
            finally:
                loader.close()


if __name__ == "__main__":
    unittest.main()
