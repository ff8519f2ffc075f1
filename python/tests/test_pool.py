"""stallfree._pool: host buffers reused once nothing refers to them (no
cluster, no torch)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from stallfree._pool import _Pool, _ProcessPool  # noqa: E402


class PoolTest(unittest.TestCase):
    def test_a_buffer_in_use_is_never_handed_out(self):
        pool = _Pool(pinned=False, keep=8)
        a = pool.get(100)
        b = pool.get(100)
        self.assertFalse(a.base is b.base)
        view = a[10:20]  # a view of a view keeps the buffer in use
        del a
        c = pool.get(50)
        self.assertFalse(c.base is view.base or c.base is b.base)
        del view, c
        self.assertEqual(len(pool.get(100)), 100)
        self.assertEqual(len(pool.buffers), 3, "a free buffer was reused, not a fourth made")

    def test_a_buffer_made_with_room_fits_larger_asks(self):
        """A batch of JPEGs a few percent larger than the last reuses its
        buffer when the buffer was made with room (capacity)."""
        pool = _Pool(pinned=False, keep=8)
        a = pool.get(100, capacity=128)
        self.assertEqual(len(a), 100)
        first = a.__array_interface__["data"][0]  # not a reference, which would keep it in use
        del a
        b = pool.get(120)
        self.assertEqual(b.__array_interface__["data"][0], first, "the buffer with room was reused")
        self.assertEqual((len(b), len(pool.buffers)), (120, 1))
        c = pool.get(64, capacity=32)  # b in use: a new one, never smaller than asked
        self.assertEqual(len(c), 64)
        self.assertEqual(len(c.base), 64)

    def test_a_batch_finds_each_free_buffer_at_once(self):
        """Buffers come back in about the order they went: the scan starts
        after the last one handed out, so the k-th get of a batch looks at
        one buffer, not at k busy ones first."""
        pool, n = _Pool(pinned=False, keep=1024), 64
        held = [pool.get(1000) for _ in range(n)]
        looked = []
        free = _Pool._free
        pool._free = lambda b: looked.append(b) or free(b)
        for k in range(n):  # the batch before is let go as the next one is made, in order
            held[k] = None
            held[k] = pool.get(1000)
        self.assertEqual(len(pool.buffers), n, "each get reused the buffer let go just before")
        self.assertLessEqual(len(looked), 2 * n, f"{len(looked)} buffers looked at for {n} gets")

    def test_forgets_free_buffers_beyond_keep(self):
        pool = _Pool(pinned=False, keep=2)
        a, b, c = pool.get(10), pool.get(10), pool.get(10)
        self.assertEqual(len(pool.buffers), 3, "buffers in use are kept, whatever keep says")
        del a, b
        d = pool.get(100)  # none fits: a new one, and past keep the free ones are forgotten
        self.assertEqual([x.array.nbytes for x in pool.buffers], [10, 100])
        self.assertIs(pool.buffers[0].array, c.base)
        del d


class ProcessPoolTest(unittest.TestCase):
    def test_each_process_and_copy_has_buffers_of_its_own(self):
        import pickle

        def where(a):
            return a.__array_interface__["data"][0]

        pool = _ProcessPool(keep=4)
        first = where(pool.get(100))  # free again: the view is gone
        self.assertEqual(where(pool.get(100)), first, "reused within the process")
        copy = pickle.loads(pickle.dumps(pool))
        self.assertIsNone(copy._pool, "a copy carries no buffers")
        held = pool.get(100)  # the parent's buffer in use: a copy reusing it would hand it out twice
        self.assertNotEqual(where(copy.get(100)), where(held))
        del held
        parents = pool._pool  # its buffers stay, as in a forked child's copy of memory
        pool._pid = -1  # as in a forked child: another process id
        self.assertNotEqual(where(pool.get(100)), first, "a child makes its own")
        self.assertIsNot(pool._pool, parents)


if __name__ == "__main__":
    unittest.main()
