"""The client retries 503 + Retry-After with backoff (a node catching up its
catalog after a restart answers so for seconds), and nothing else."""

import http.server
import json
import os
import sys
import threading
import types
import unittest
import weakref

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from stallfree import Client, StallfreeError  # noqa: E402
from stallfree.batchloader import BatchLoader  # noqa: E402

from harness import without_cyclic_gc  # noqa: E402


class Stub(http.server.BaseHTTPRequestHandler):
    busy = 0          # answer this many /v1/datasets with 503 + Retry-After
    retry_after = "0"
    calls = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/v1/cluster":
            return self.answer(200, {"self": "stub", "leader": "stub", "members": []})
        type(self).calls += 1
        if type(self).calls <= type(self).busy:
            return self.answer(503, {"error": "catalog not caught up yet"}, self.retry_after)
        self.answer(200, [{"name": "imgs"}])

    def answer(self, code, body, retry_after=None):
        b = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.end_headers()
        self.wfile.write(b)

    def log_message(self, *args):
        pass


class RetryTest(unittest.TestCase):
    def serve(self, busy, retry_after="0"):
        handler = type("H", (Stub,), {"busy": busy, "retry_after": retry_after, "calls": 0})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        return handler, f"http://127.0.0.1:{srv.server_address[1]}"

    def test_503_with_retry_after_is_retried_past_the_retry_count(self):
        handler, url = self.serve(busy=8)
        c = Client(url, retries=3)
        c.busy_backoff = 0.001
        self.assertEqual(c.json("GET", "/v1/datasets"), [{"name": "imgs"}])
        self.assertEqual(handler.calls, 9)

    def test_503_goes_to_another_node_before_waiting(self):
        busy, busy_url = self.serve(busy=1000, retry_after="5")
        free, free_url = self.serve(busy=0)
        c = Client([busy_url, free_url], retries=3)
        c.busy_wait = 1  # less than the Retry-After: waiting it out would give up
        self.assertEqual(c.json("GET", "/v1/datasets"), [{"name": "imgs"}])
        self.assertEqual((busy.calls, free.calls), (1, 1))

    def test_503_retries_end_after_busy_wait(self):
        handler, url = self.serve(busy=1000)
        c = Client(url, retries=3)
        c.busy_backoff, c.busy_wait = 0.001, 0.05
        with self.assertRaises(StallfreeError) as e:
            c.json("GET", "/v1/datasets")
        self.assertEqual(e.exception.status, 503)
        self.assertIn("catalog not caught up", e.exception.message)
        self.assertLess(handler.calls, 1000)


    def test_a_retried_request_lets_go_of_what_it_held(self):
        """After a 503 and a retry that succeeds, what the request held (its
        reader here, its body, pooled buffers in the loaders) is freed when
        it returns, not when the cyclic GC runs: the caught exception would
        hold the request's frame, and the frame the exception."""
        handler, url = self.serve(busy=1)
        c = Client(url, retries=3)
        c.busy_backoff = 0.001

        class Reader:
            def __call__(self, response):
                return response.read()

        reader = Reader()
        gone = weakref.ref(reader)
        with without_cyclic_gc():
            _, data = c.request("GET", "/v1/datasets", reader=reader)
            del reader
            self.assertIsNone(gone(), "the reader is freed")
        self.assertEqual((json.loads(data), handler.calls), ([{"name": "imgs"}], 2))

    def test_a_loader_retry_lets_go_of_its_fetch(self):
        """BatchLoader's retry after node loss, likewise: the fetch (which
        holds the batch's buffer) is freed once the retry returns."""
        class Fetch:
            tries = 0

            def __call__(self):
                self.tries += 1
                if self.tries == 1:
                    raise StallfreeError(503, "owner gone")
                return "batch"

        fetch = Fetch()
        gone = weakref.ref(fetch)
        with without_cyclic_gc():
            got = BatchLoader._retrying(types.SimpleNamespace(retries=2), fetch)
            self.assertEqual((got, fetch.tries), ("batch", 2))
            del fetch
            self.assertIsNone(gone(), "the fetch is freed")

if __name__ == "__main__":
    unittest.main()
