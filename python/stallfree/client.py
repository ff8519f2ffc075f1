"""HTTP client with pooled keep-alive connections and fail-over between nodes."""

import concurrent.futures
import http.client
import ipaddress
import json
import os
import socket
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


class NodeUnreachable(ConnectionError):
    """No node answered: every attempt failed to connect or was cut off.
    ``nodes`` are the URLs tried; the message names them and the last error."""

    def __init__(self, nodes, last):
        super().__init__(f"no Stallfree node reachable at {', '.join(nodes)}: {last}")
        self.nodes = list(nodes)


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix stream socket (a node's ``--socket``)."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self.path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def _socket_path(base):
    """The path of a ``unix:///path`` base URL, or None."""
    return base[len("unix://"):] if base.startswith("unix://") else None


def _loopback(host):
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _msgpack_len(n, small, codes):
    """msgpack's header for a length n: small | n when it fits in the
    fix-format (small is not None), else the first of codes (8, 16, 32
    bits) whose width holds n."""
    if small is not None and n < 16:
        return bytes([small | n])
    for code, width in zip(codes, (1, 2, 4)[3 - len(codes):]):
        if n < 1 << (8 * width):
            return bytes([code]) + n.to_bytes(width, "big")
    raise ValueError(f"{n} is too long for msgpack")


def _items_body(items):
    """The msgpack of [{"index": i, "data": d}] for a batch write, as a
    tuple of buffers to send one after the other: each item's bytes are
    sent from where they are (a reused buffer), not copied into one body
    first."""
    out = [_msgpack_len(len(items), 0x90, (0xdc, 0xdd))]
    for i, d in items:
        d = memoryview(d).cast("B")
        head = _msgpack_len(d.nbytes, None, (0xc4, 0xc5, 0xc6))  # bin 8, 16 or 32
        out.append(b"\x82\xa5index" + msgpack.packb(int(i)) + b"\xa4data" + head)
        out.append(d)
    return tuple(out)


class Client:
    """A client of one node, failing over to the cluster's other nodes.

    ``url`` is the local node (``http://127.0.0.1:7070``, or its Unix socket
    ``unix:///path/to/stallfree.sock``); ``token`` the bearer token if the
    cluster has one. Connections are kept alive and belong to one thread and
    one process: a DataLoader worker forked from a process that already used
    the client opens its own.

    A node on this host (a loopback URL) is reached through its Unix socket
    when it has one this process can open (``GET /v1/cluster`` names it, and
    the node behind the socket must answer as the same member); otherwise,
    silently, over TCP. ``use_socket=False`` keeps to TCP.
    """

    def __init__(self, url, token=None, timeout=60.0, retries=3, route="local", use_socket=True):
        if route not in ("local", "owner"):
            raise ValueError(f"route={route!r}: want 'local' or 'owner'")
        self.urls = [url.rstrip("/")] if isinstance(url, str) else [u.rstrip("/") for u in url]
        self.token = token
        self.timeout = timeout
        self.retries = retries
        # route="owner": reads by index go straight to the node that owns the
        # index (GET /v1/datasets/{ds}/owners), batches split by owner.
        self.route = route
        self._owners = {}  # dataset -> (ring, [base url per member], owners bytes, width)
        self._pool = None
        self._pool_lock = threading.Lock()  # BatchLoader's threads share one client
        self._local = threading.local()
        self._pid = os.getpid()
        self._peers_loaded = False
        # Loader fast path: http base URL -> the node's Unix socket path, for
        # loopback nodes whose socket answered as the same member; probed
        # once per base (the answer holds in forked workers too).
        self.use_socket = use_socket
        self._sockets, self._probed = {}, set()

    def __getstate__(self):  # a copy sent to another process opens its own sockets and threads
        s = dict(self.__dict__)
        s["_local"], s["_pool"], s["_pid"], s["_pool_lock"] = None, None, -1, None
        return s

    def __setstate__(self, s):
        self.__dict__.update(s)
        self._local = threading.local()
        self._pool_lock = threading.Lock()
        self._pid = os.getpid()

    def close(self):
        """Closes this thread's connections (others close with their threads)."""
        for base in list(getattr(self._local, "conns", {})):
            self._drop(base)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- connections -------------------------------------------------------

    def _check_fork(self):
        if self._pid != os.getpid():  # forked: the parent's sockets, threads and locks are not ours
            self._local = threading.local()
            self._pool = None
            self._pool_lock = threading.Lock()
            self._pid = os.getpid()

    def _conn(self, base):
        self._check_fork()
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        c = conns.get(base)
        if c is None:
            path = _socket_path(base) or self._socket_of(base)
            if path:
                c = _UnixHTTPConnection(path, self.timeout)
            else:
                u = urllib.parse.urlsplit(base)
                c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=self.timeout)
            conns[base] = c
        return c

    def _socket_of(self, base):
        """The Unix socket to reach the node at http URL base through, or
        None (not on this host, no socket, not ours to open, not the same
        node). Best effort: any failure means TCP."""
        if not self.use_socket:
            return None
        if base not in self._probed:
            u = urllib.parse.urlsplit(base)
            if u.scheme != "http" or not _loopback(u.hostname or ""):
                self._probed.add(base)
                return None
            try:
                path = self._probe_socket(u)
            except _RETRYABLE:
                return None  # the node is not up (yet): ask again with the next connection
            except Exception:  # noqa: BLE001 - the socket is an optimisation
                path = None
            self._probed.add(base)
            if path:
                self._sockets[base] = path
        return self._sockets.get(base)

    def _probe_socket(self, u):
        def cluster(conn):
            h = {"Authorization": "Bearer " + self.token} if self.token else {}
            try:
                conn.request("GET", "/v1/cluster", headers=h)
                r = conn.getresponse()
                body = r.read()
            finally:
                conn.close()
            if r.status != 200:
                return None, None
            cl = json.loads(body)
            me = next((m for m in cl.get("members", []) if m.get("name") == cl.get("self")), {})
            return (cl.get("self"), me.get("http")), me.get("socket")

        who, path = cluster(http.client.HTTPConnection(u.hostname, u.port or 80, timeout=min(self.timeout, 5.0)))
        if not path or not os.access(path, os.R_OK | os.W_OK):
            return None
        # The same path may be another node's (containers, a node restarted
        # with other addresses): use it only if it answers as this member.
        try:
            same, _ = cluster(_UnixHTTPConnection(path, min(self.timeout, 5.0)))
        except _RETRYABLE:
            return None  # a socket nobody serves: not a reason to ask again
        return path if same == who else None

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

    def _request_once(self, base, method, path, body=None, headers=None, reader=None):
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
            # reader(r) consumes a successful answer's body itself (streamed
            # into the caller's buffers) and returns what stands for it.
            data = reader(r) if reader is not None and r.status < 300 else r.read()
        except _RETRYABLE:
            self._drop(base)
            self._sockets.pop(base, None)  # a socket that failed once: TCP from now on
            raise
        except BaseException:
            self._drop(base)  # a reader that gave up mid-body leaves the connection unusable
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

    # A 503 with Retry-After (a node at its in-flight bound, or one whose
    # catalog is still catching up with the leader's after a restart) is
    # retried at once on the next known node; once every known node has
    # answered so, after max(Retry-After, a backoff doubling from
    # busy_backoff to 4 s), for up to busy_wait seconds of waiting in all.
    busy_backoff = 0.1
    busy_wait = 30.0

    def request(self, method, path, body=None, headers=None, reader=None):
        """Sends a request; connection failures and 503s are retried on the
        next known node (the others are learned from /v1/cluster on first use).
        ``reader(response)``, when given, reads a successful answer's body
        (and may be called again on a retry); its result stands for the body."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        if not self._peers_loaded:
            self._load_peers()
        last = None
        attempt, turn = 0, 0
        backoff, waited = self.busy_backoff, 0.0
        try:
            while True:
                base = self.urls[turn % len(self.urls)]
                turn += 1
                try:
                    return self._request_once(base, method, path, body, headers, reader)
                except StallfreeError as e:
                    if e.status != 503:
                        raise
                    last = e
                    if e.retry_after is not None:  # busy or catching up, not down
                        if turn % len(self.urls):
                            continue  # another node may answer now
                        wait = max(e.retry_after, backoff)
                        backoff = min(2 * backoff, 4.0)
                        if waited + wait > self.busy_wait:
                            raise
                        waited += wait
                        time.sleep(wait)
                        continue
                except _RETRYABLE as e:
                    last = e
                attempt += 1
                if attempt >= self.retries * len(self.urls):
                    if isinstance(last, StallfreeError):
                        raise last
                    raise NodeUnreachable(self.urls, last) from last
                time.sleep(min(0.05 * attempt, 0.5))
        finally:
            # A caught exception's traceback holds this frame, whose `last`
            # holds the exception: a cycle that would keep body and reader
            # (pooled buffers) until the cyclic GC runs, after a retry that
            # succeeded too.
            last = None

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
        path = f"/v1/datasets/{self._q(dataset)}/index/{int(i)}"
        if self.route == "owner":
            owner = self._owner_of(dataset, [int(i)])[0]
            if owner is not None:
                got = self._from_owner(dataset, owner, "GET", path)
                if got is not None:
                    return got
        return self.request("GET", path)[1]

    def batch(self, dataset, indices):
        """[(key, bytes)] for the indices, in order, in one request (with
        route="owner": one request per owning node, in parallel)."""
        indices = [int(i) for i in indices]
        path = f"/v1/datasets/{self._q(dataset)}/batch"
        if self.route == "owner" and len(indices) > 1:
            got = self._batch_by_owner(dataset, path, indices)
            if got is not None:
                return got
        _, data = self.request("POST", path, {"indices": indices})
        return [(d["key"], d["data"]) for d in msgpack.unpackb(data, raw=False)]

    def put_items(self, dataset, items):
        """Writes several items of a derived dataset in one request (``PUT
        /v1/datasets/{name}/batch``), each at its owner: ``items`` is
        [(index, bytes)]. Returns one dict per item, in order: ``{"index",
        "status", "bytes", "created"}`` and ``"error"`` when the status is no
        2xx (409: other bytes were written first; 507: no room; 503: the
        owner unreachable). A bad batch raises StallfreeError, and nothing
        of it is written."""
        body = _items_body(items)
        _, data = self.request("PUT", f"/v1/datasets/{self._q(dataset)}/batch", body,
                               {"Content-Type": "application/msgpack",
                                "Content-Length": str(sum(memoryview(p).nbytes for p in body))})
        got = json.loads(data)
        if len(got) != len(items):
            raise StallfreeError(502, f"{dataset}: {len(got)} write results for {len(items)} items")
        return got

    # -- owner routing -----------------------------------------------------

    def owners(self, dataset):
        """The dataset's owner table: ``{"ring", "members": [{"name", "http"}],
        "owners": bytes}`` (one byte per index, two little-endian past 255
        members: the owner's position in members)."""
        return msgpack.unpackb(self.request("GET", f"/v1/datasets/{self._q(dataset)}/owners")[1], raw=False)

    def _owner_of(self, dataset, indices):
        """Base URLs of the owners of indices (None where unknown)."""
        t = self._owners.get(dataset)
        if t is None:
            try:
                o = self.owners(dataset)
            except Exception:  # noqa: BLE001 - owner routing is an optimisation
                return [None] * len(indices)
            bases = ["http://" + m["http"] if m.get("http") else None for m in o["members"]]
            width = 2 if len(bases) > 255 else 1
            t = self._owners[dataset] = (o["ring"], bases, o["owners"], width)
        _, bases, table, width = t
        out = []
        for i in indices:
            if width == 1:
                x = table[i] if 0 <= i < len(table) else None
            else:
                x = int.from_bytes(table[2 * i:2 * i + 2], "little") if 0 <= 2 * i < len(table) else None
            out.append(bases[x] if x is not None and x < len(bases) else None)
        return out

    def _from_owner(self, dataset, base, method, path, body=None, reader=None):
        """One attempt at the owner; None (and a fresh table next time) on any
        failure, so the caller falls back to its own node."""
        try:
            r, data = self._request_once(base, method, path, body, reader=reader)
        except StallfreeError as e:
            if e.status == 404 and e.message == "not written":
                raise  # the owner's answer (a derived item), not a routing failure
            self._owners.pop(dataset, None)
            return None
        except Exception:  # noqa: BLE001 - fall back to url
            self._owners.pop(dataset, None)
            return None
        t = self._owners.get(dataset)
        if t is not None and r.getheader("X-Ring") != t[0]:
            self._owners.pop(dataset, None)  # membership changed: refresh on the next read
        return data

    def _batch_by_owner(self, dataset, path, indices):
        results = self._by_owner(dataset, path, indices, lambda r, positions: msgpack.unpackb(r.read(), raw=False))
        if results is None:
            return None
        out = [None] * len(indices)
        for positions, items in results:
            for p, d in zip(positions, items):
                out[p] = (d["key"], d["data"])
        return out

    def _by_owner(self, dataset, path, indices, sink):
        """[(positions, sink(response, positions))] of one batch request per
        owner of indices (in parallel), positions being where the part's
        items sit in indices; None when an owner is unknown."""
        owners = self._owner_of(dataset, indices)
        if any(o is None for o in owners):
            return None
        parts = {}
        for pos, o in enumerate(owners):
            parts.setdefault(o, []).append(pos)

        def fetch(item):
            base, positions = item
            body = json.dumps({"indices": [indices[p] for p in positions]}).encode()
            reader = lambda r: sink(r, positions)  # noqa: E731
            data = self._from_owner(dataset, base, "POST", path, body, reader)
            if data is None:
                _, data = self.request("POST", path, body, reader=reader)
            return positions, data

        if len(parts) == 1:
            return [fetch(next(iter(parts.items())))]
        self._check_fork()
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
        return list(self._pool.map(fetch, parts.items()))

    def batch_into(self, dataset, indices, sink):
        """Streams the batch answer for indices to ``sink(response,
        positions)``, which reads the body itself: the msgpack array of the
        items at ``positions`` of indices (all of them, or with
        route="owner" one owner's part per call, from parallel threads).
        Returns [(positions, what sink returned)]. A sink may be called again
        for the same positions after a failure mid-body (a retry)."""
        indices = [int(i) for i in indices]
        path = f"/v1/datasets/{self._q(dataset)}/batch"
        if self.route == "owner" and len(indices) > 1:
            got = self._by_owner(dataset, path, indices, sink)
            if got is not None:
                return got
        everything = list(range(len(indices)))
        _, data = self.request("POST", path, {"indices": indices}, reader=lambda r: sink(r, everything))
        return [(everything, data)]

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

    def resumed_order(self, job, epoch, rank, generation, position):
        """Rank's order for the rest of an epoch interrupted when every rank of
        job ``generation`` had consumed ``position`` samples (the current
        generation, or the one a resize replaced)."""
        path = (f"/v1/jobs/{self._q(job)}/epochs/{int(epoch)}/ranks/{int(rank)}"
                f"?from_generation={int(generation)}&position={int(position)}")
        return self.json("GET", path)["indices"]

    def stats(self):
        return self.json("GET", "/v1/stats")

    def report_wait(self, seconds, batches, job="", rank=0, step_seconds=None, items=None, dataset=None, epoch_end=False):
        """Reports time a training loop waited for data (the stall meter) and,
        for the memory split, the time it held its batches (step time), the
        items in them, their dataset and whether the epoch ended."""
        body = {"seconds": float(seconds), "batches": int(batches), "job": job, "rank": int(rank)}
        if step_seconds is not None:
            body["step_seconds"] = float(step_seconds)
        if items is not None:
            body["items"] = int(items)
        if dataset:
            body["dataset"] = dataset
        if epoch_end:
            body["epoch_end"] = True
        self.request("POST", "/v1/loader/wait", body)

    def set_quota(self, dataset, quota):
        """Sets a dataset's cluster-wide cache quota in bytes (None lifts it)."""
        return self.json("PUT", f"/v1/datasets/{self._q(dataset)}", {"quota": None if quota is None else int(quota)})

    def plan(self):
        """GET /v1/plan: the memory split the jobs' reports suggest."""
        return self.json("GET", "/v1/plan")

    def apply_plan(self):
        """POST /v1/plan/apply: plans and sets the quotas of the split."""
        return self.json("POST", "/v1/plan/apply")
