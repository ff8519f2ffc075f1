"""What every ``python -m stallfree.bench`` mode needs: free ports, waiting
for a condition, CPU seconds of a process, the machine's description, and
rewriting one marked section of BENCHMARKS.md. One module, tested
(``test_bench_common``), instead of a copy in each bench."""

import os
import platform
import resource
import socket
import sys
import time

#: make bench (bench/report.go) keeps what is below this marker of
#: BENCHMARKS.md when it rewrites the file; the Python benches' sections live there.
KEPT_MARKER = "<!-- kept by make bench: sections of other benchmarks below -->"


def log(*a):
    """A progress line on stderr (stdout is the report's)."""
    print(*a, file=sys.stderr, flush=True)


#: Locks on the ports free_port handed out last, oldest first. A port is
#: only at risk between the draw and its node's bind; by the time this many
#: more have been drawn, its node has bound it (or is gone), so the oldest
#: lock is let go, and a long test run holds a bounded number of files.
_RESERVED = {}
_HELD = 64


def free_port():
    """A TCP and UDP port on 127.0.0.1 nobody listens on now, and one no
    other test is handed meanwhile: neither this process (the last 64 it
    drew) nor a Go test (testutil.FreeAddr locks the same files).

    It is drawn below Linux's ephemeral range (32768 and up). A port the
    kernel hands out for port 0 is one it may also give an outgoing
    connection as its source port, and a node started a moment later would
    then find it taken. Drawing alone repeats ports: a harness of three
    nodes takes twelve."""
    import fcntl
    import random
    import tempfile

    locks = os.path.join(tempfile.gettempdir(), "stallfree-test-ports")
    os.makedirs(locks, exist_ok=True)
    for _ in range(500):
        port = random.randrange(20000, 32768)
        if port in _RESERVED:
            continue
        try:
            fd = os.open(os.path.join(locks, str(port)), os.O_RDONLY | os.O_CREAT, 0o444)
        except OSError:
            continue  # a file this user may not open: draw again
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):  # gossip binds both
                with socket.socket(socket.AF_INET, kind) as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            os.close(fd)
            continue  # another test has it, or something listens there: draw again
        _RESERVED[port] = fd
        while len(_RESERVED) > _HELD:
            os.close(_RESERVED.pop(next(iter(_RESERVED))))
        return port
    raise RuntimeError("no free port among 500 drawn in [20000, 32768)")


def wait(cond, timeout, what, poll=0.05):
    """Returns once cond() is true; cond raising counts as not yet. Raises
    RuntimeError naming what after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if time.monotonic() >= deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(poll)


def count_call(path):
    """Appends a byte to the file at path: a call counted where the callers
    are several processes (DataLoader workers, a group's jobs); the file's
    size is the count."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)


def calls_in(path):
    """The calls count_call counted in the file at path (0 before the first)."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def proc_cpu(pid):
    """CPU seconds (user + system) process pid has used (0 for None)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu():
    """CPU seconds of this process and its waited-for children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def cpu_model():
    """The CPU's model name (the machine's architecture where unknown)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


# virtio's device id of a memory balloon, and its feature bit "free page
# reporting" (the virtio 1.2 spec, 5.5.3).
_BALLOON, _REPORTING = 5, 5


def memory_note(root="/sys/bus/virtio/devices"):
    """A note for a bench's machine line where this is a VM that gives the
    memory its guest frees back to the host (virtio-balloon free page
    reporting), else "". On such a VM a page freed and touched again a few
    seconds later is faulted in by the host too: 6-9 µs a 4 KiB page
    against 0.3 µs where the memory was freed a moment before (BENCHMARKS.md,
    "Fresh memory on a VM"), so any row that takes fresh memory scatters with
    what ran before it."""
    try:
        devices = os.listdir(root)
    except OSError:
        return ""
    for dev in devices:
        try:
            with open(os.path.join(root, dev, "device")) as f:
                if int(f.read().strip(), 16) != _BALLOON:
                    continue
            with open(os.path.join(root, dev, "features")) as f:
                bits = f.read().strip()
        except (OSError, ValueError):
            continue
        if len(bits) > _REPORTING and bits[_REPORTING] == "1":
            return "a VM that gives freed memory back to its host (virtio-balloon free page reporting)"
    return ""


def load_avg():
    return "load average %.2f, %.2f, %.2f" % os.getloadavg()


def write_section(doc, begin, end, text):
    """Replaces the text between the markers begin and end in doc (below
    KEPT_MARKER, added when missing), or appends it there the first time:
    the rest of the file belongs to other benches."""
    old = open(doc).read() if os.path.exists(doc) else ""
    section = f"{begin}\n{text.rstrip()}\n{end}\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + section + rest.split(end, 1)[1].lstrip("\n")
    else:
        if KEPT_MARKER not in old:
            old = old.rstrip("\n") + "\n\n" + KEPT_MARKER + "\n"
        new = old.rstrip("\n") + "\n\n" + section
    with open(doc, "w") as f:
        f.write(new)
