"""The test harness itself: a cluster whose port was taken before its node
bound it is started again on fresh ports, and a node that exits for any
other reason fails the start at once."""

import os
import shutil
import socket
import tempfile
import unittest

import harness
from stallfree import Client


class ClusterStartTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="stallfree-harness")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.real_free_port = harness.free_port
        self.addCleanup(setattr, harness, "free_port", self.real_free_port)

    def test_a_taken_port_is_tried_again(self):
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        self.addCleanup(taken.close)
        port = taken.getsockname()[1]
        # The second port handed out (the first node's gossip port) is bound
        # already: memberlist's bind fails as it would after a race.
        handed = iter([self.real_free_port(), port])
        harness.free_port = lambda: next(handed, None) or self.real_free_port()
        c = harness.Cluster(self.tmp, n=1)
        self.addCleanup(c.stop)
        with open(os.path.join(self.tmp, "py1.log")) as f:
            self.assertIn("address already in use", f.read(), "the first start did not meet the taken port")
        self.assertNotIn(f":{port}", c.nodes[0][1])
        self.assertEqual(Client(c.nodes[0][1]).json("GET", "/v1/cluster")["members"][0]["state"], "alive")

    def test_a_node_that_exits_fails_the_start_at_once(self):
        # --data-dir is a regular file: the node exits at once, and the
        # start says so (NodeExited) instead of waiting out its deadline.
        with open(os.path.join(self.tmp, "py1"), "w"):
            pass
        with self.assertRaises(harness.NodeExited) as e:
            harness.Cluster(self.tmp, n=1)
        self.assertIn("exited", str(e.exception))


if __name__ == "__main__":
    unittest.main()
