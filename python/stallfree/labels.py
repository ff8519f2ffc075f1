"""Labels of a dataset's items: ``labels="folder"`` or ``labels=fn(key)``.

``"folder"`` is torchvision's ``ImageFolder`` rule: an item's class is the
first component of its key (the directory directly under the dataset's
root, however deep the file sits below it), and the classes are numbered
0..C-1 in sorted order. It is worked out once per dataset, when the loader
is made, from the manifest, and is then a table lookup per batch (no key,
no Python call per sample).

The node has no route that lists a manifest's keys, but the manifest is
sorted bytewise by key, so every class is one contiguous run of indices.
The runs are found by bisection over the keys of a few indices (the
``X-Key`` header of ``GET .../index/{i}``): about 2·C·log2(N/C) reads for C
classes, not N.

Tar datasets are not supported by ``"folder"`` (their keys are
``SHARD/SAMPLEKEY`` and classes are usually a ``cls`` member): pass a
function of the key.
"""

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is needed for labels
    np = None

__all__ = ["Labels", "folder_of"]


def folder_of(key):
    """The class folder of a key (its first path component), or None for a
    file directly under the root."""
    head, sep, _ = key.partition("/")
    return head if sep else None


class Labels:
    """What ``labels=`` asks for, ready to label batches: ``of(indices,
    keys)`` is an int64 array. ``classes`` lists the folder names (label k
    is ``classes[k]``) for ``"folder"``; ``needs_keys`` says whether ``of``
    needs the batch's keys (a function does; ``"folder"`` does not)."""

    def __init__(self, spec, client, dataset, tar=False):
        if np is None:
            raise ImportError("labels need numpy")
        self.fn, self.classes = None, None
        if callable(spec):
            self.fn = spec
            return
        if spec != "folder":
            raise ValueError(f"labels={spec!r}: want 'folder' or a function of the key")
        if tar:
            raise ValueError(f"labels='folder' on tar dataset {dataset!r}: keys are SHARD/SAMPLEKEY; "
                             "pass labels=fn(key) (or read the sample's cls member)")
        n = int(client.dataset(dataset)["items"])
        runs = _runs(lambda i: _key(client, dataset, i), n)
        names = [folder for _, folder, _ in runs]
        if None in names:
            key = next(k for _, folder, k in runs if folder is None)
            raise ValueError(f"labels='folder': {key!r} in {dataset!r} is directly under the root, in no class folder")
        if len(set(names)) != len(names):  # cannot happen with a bytewise-sorted manifest
            raise ValueError(f"labels='folder': the classes of {dataset!r} are not contiguous in its manifest")
        self.classes = sorted(names)
        rank = {c: k for k, c in enumerate(self.classes)}
        self._starts = np.array([start for start, _, _ in runs], dtype=np.int64)
        self._ids = np.array([rank[c] for c in names], dtype=np.int64)

    @property
    def needs_keys(self):
        return self.fn is not None

    def of(self, indices, keys=None):
        """The labels of the items at indices (whose keys are keys)."""
        if self.fn is not None:
            return np.array([int(self.fn(k)) for k in keys], dtype=np.int64)
        pos = np.searchsorted(self._starts, np.asarray(indices, dtype=np.int64), side="right") - 1
        return self._ids[pos]


def _key(client, dataset, i):
    r, _ = client.request("GET", f"/v1/datasets/{client._q(dataset)}/index/{int(i)}")
    return r.getheader("X-Key")


def _runs(key_of, n):
    """[(first index, folder, a key)] of each run of equal folders among
    indices 0..n-1, given that equal folders are contiguous."""
    if n == 0:
        return []
    keys = {}

    def folder(i):
        if i not in keys:
            keys[i] = key_of(i)
        return folder_of(keys[i])

    starts = {0: folder(0)}
    stack = [(0, n - 1)]  # ranges whose ends differ in folder may hold a boundary
    while stack:
        lo, hi = stack.pop()
        if folder(lo) == folder(hi):
            continue  # contiguity: everything between is that folder too
        if hi == lo + 1:
            starts[hi] = folder(hi)
            continue
        mid = (lo + hi) // 2
        stack += [(lo, mid), (mid, hi)]
    return [(s, starts[s], keys[s]) for s in sorted(starts)]
