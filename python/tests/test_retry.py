"""The client retries 503 + Retry-After with backoff (a node catching up its
catalog after a restart answers so for seconds), and nothing else."""

import http.server
import json
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from stallfree import Client, StallfreeError  # noqa: E402


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


if __name__ == "__main__":
    unittest.main()
