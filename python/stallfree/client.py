"""HTTP client with pooled keep-alive connections and fail-over between nodes."""

import http.client
import json
import os
import threading
import time
import urllib.parse

import msgpack


class StallfreeError(Exception):
    """A node answered with an error status (not retried)."""

    def __init__(self, status, message, retry_after=None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        # Seconds the node asked to wait before retrying (503 when its
        # in-flight response bytes are at their bound), or None.
        self.retry_after = retry_after
        self.message = message


_RETRYABLE = (ConnectionError, TimeoutError, http.client.HTTPException, OSError)


class Client:
    """A client of one node, failing over to the cluster's other nodes.

    ``url`` is the local node (``http://127.0.0.1:7070``); ``token`` the bearer
    token if the cluster has one. Connections are kept alive and belong to one
    thread and one process: a DataLoader worker forked from a process that
    already used the client opens its own.
    """

    def __init__(self, url, token=None, timeout=60.0, retries=3):
        self.urls = [url.rstrip("/")] if isinstance(url, str) else [u.rstrip("/") for u in url]
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self._local = threading.local()
        self._pid = os.getpid()
        self._peers_loaded = False

    def close(self):
        """Closes this thread's connections (others close with their threads)."""
        for base in list(getattr(self._local, "conns", {})):
            self._drop(base)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- connections -------------------------------------------------------

    def _conn(self, base):
        if self._pid != os.getpid():  # forked: the parent's sockets are not ours
            self._local = threading.local()
            self._pid = os.getpid()
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        c = conns.get(base)
        if c is None:
            u = urllib.parse.urlsplit(base)
            c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=self.timeout)
            conns[base] = c
        return c

    def _drop(self, base):
        conns = getattr(self._local, "conns", {})
        c = conns.pop(base, None)
        if c is not None:
            c.close()

    def _load_peers(self):
        """Learns the other members, so a dead local node is not fatal."""
        self._peers_loaded = True
        try:
            cl = self._request_once(self.urls[0], "GET", "/v1/cluster")
        except Exception:  # noqa: BLE001 - best effort
            return
        for m in json.loads(cl[1]).get("members", []):
            u = "http://" + m.get("http", "")
            if m.get("state") == "alive" and m.get("http") and u not in self.urls:
                self.urls.append(u)

    def _request_once(self, base, method, path, body=None, headers=None):
        c = self._conn(base)
        h = {"Connection": "keep-alive"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if body is not None:
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
        except _RETRYABLE:
            self._drop(base)
            raise
        if r.status >= 300:
            try:
                msg = json.loads(data).get("error", data.decode(errors="replace"))
            except ValueError:
                msg = data.decode(errors="replace")
            retry_after = None
            try:
                retry_after = min(float(r.getheader("Retry-After")), 10.0)
            except (TypeError, ValueError):
                pass
            raise StallfreeError(r.status, msg, retry_after)
        return r, data

    def request(self, method, path, body=None, headers=None):
        """Sends a request; connection failures and 503s are retried on the
        next known node (the others are learned from /v1/cluster on first use)."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        if not self._peers_loaded:
            self._load_peers()
        last = None
        for attempt in range(self.retries * len(self.urls)):
            base = self.urls[attempt % len(self.urls)]
            try:
                return self._request_once(base, method, path, body, headers)
            except StallfreeError as e:
                if e.status != 503:
                    raise
                last = e
                if e.retry_after is not None:  # busy, not down: wait as told
                    time.sleep(e.retry_after)
                    continue
            except _RETRYABLE as e:
                last = e
            time.sleep(min(0.05 * (attempt + 1), 0.5))
        raise last

    def json(self, method, path, body=None):
        _, data = self.request(method, path, body)
        return json.loads(data) if data else None

    # -- items ---------------------------------------------------------------

    @staticmethod
    def _q(s):
        return urllib.parse.quote(s, safe="")

    def item(self, dataset, key):
        """The bytes of one item by key."""
        path = "/".join(self._q(p) for p in key.split("/"))
        return self.request("GET", f"/v1/datasets/{self._q(dataset)}/items/{path}")[1]

    def index(self, dataset, i):
        """The bytes of the i-th item of the manifest."""
        return self.request("GET", f"/v1/datasets/{self._q(dataset)}/index/{int(i)}")[1]

    def batch(self, dataset, indices):
        """[(key, bytes)] for the indices, in order, in one request."""
        _, data = self.request("POST", f"/v1/datasets/{self._q(dataset)}/batch", {"indices": [int(i) for i in indices]})
        return [(d["key"], d["data"]) for d in msgpack.unpackb(data, raw=False)]

    def job_batch(self, job, epoch, rank, b):
        """[(key, bytes)] of minibatch b of a job's rank; on a tar dataset,
        its samples as dicts (see ``sample``)."""
        _, data = self.request("GET", f"/v1/jobs/{self._q(job)}/epochs/{int(epoch)}/ranks/{int(rank)}/batches/{int(b)}")
        return [d if "__key__" in d else (d["key"], d["data"]) for d in msgpack.unpackb(data, raw=False)]

    def sample(self, dataset, i):
        """Sample i of a tar dataset as WebDataset gives it:
        ``{"__key__": "SHARD/KEY", "jpg": bytes, "cls": bytes, ...}``."""
        return msgpack.unpackb(self.request("GET", f"/v1/datasets/{self._q(dataset)}/samples/{int(i)}")[1], raw=False)

    def samples(self, dataset, indices):
        """Several samples of a tar dataset, in order, in one request."""
        _, data = self.request("POST", f"/v1/datasets/{self._q(dataset)}/samples/batch",
                               {"indices": [int(i) for i in indices]})
        return msgpack.unpackb(data, raw=False)

    # -- catalog ---------------------------------------------------------------

    def dataset(self, name):
        return self.json("GET", f"/v1/datasets/{self._q(name)}")

    def job(self, name):
        return self.json("GET", f"/v1/jobs/{self._q(name)}")

    def rank_order(self, job, epoch, rank):
        return self.json("GET", f"/v1/jobs/{self._q(job)}/epochs/{int(epoch)}/ranks/{int(rank)}")["indices"]

    def stats(self):
        return self.json("GET", "/v1/stats")

    def report_wait(self, seconds, batches, job="", rank=0):
        """Reports time a training loop waited for data (the stall meter)."""
        self.request("POST", "/v1/loader/wait", {"seconds": float(seconds), "batches": int(batches), "job": job, "rank": int(rank)})
