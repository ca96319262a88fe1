"""A flood of connections that say nothing: memory stays bounded and probes get through.

Five waves, each of 4,000 TCP connections that never start TLS and 2,000 that finish
the handshake and send no request, all held open together, then closed. The server
caps its connections (``--max-connections``), closes the oldest that have not sent a
request when a new one comes, and times out silent handshakes and silent connections,
so its memory is bounded by the cap, whatever the flood, and the same after every wave.
Throughout, a fresh ``/healthz`` call (as the kubelet makes one) answers: its client
gives it 1 s, the longest a probe may wait. What is measured is printed (``-s``).
"""

from __future__ import annotations

import contextlib
import errno
import socket
import ssl
import time
from pathlib import Path

import httpx
from kit import Server
from serverkit import ServerFactory

WAVES = 5
RAW = 4000
IDLE_TLS = 2000
CAP = 1024
# A 256Mi container limit (deploy/base) with room for the Python heap and the policy.
RSS_BOUND_MB = 200
FLAT_MB = 20  # the last wave may use at most this much more than the first


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def settled(pid: int, target: float | None) -> float:
    """RSS once the server has dropped a wave's connections and given the memory back
    (it trims after bursts): read until it is at ``target`` or has stopped falling."""
    last = rss_mb(pid)
    for _ in range(100):  # bounded: at most 100 readings, 0.1 s apart
        time.sleep(0.1)
        now = rss_mb(pid)
        if (target is not None and now <= target) or (target is None and now >= last - 0.5):
            return now
        last = now
    return rss_mb(pid)


def healthz(server: Server) -> None:
    """A fresh connection and one request, as a probe makes it, within 1 s."""
    ctx = ssl.create_default_context(cafile=str(server.ca))
    r = httpx.get(server.base_url + "/healthz", verify=ctx, timeout=1.0)
    assert r.status_code == 200


def raw_connections(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", port))
        assert err in (0, errno.EINPROGRESS, errno.EAGAIN), err
        out.append(s)
    return out


def idle_tls_connections(server: Server, n: int) -> tuple[list[ssl.SSLSocket], int]:
    """Up to ``n`` handshaken TLS connections; a handshake the server cut short (it made
    room for a newer connection) is counted, not retried."""
    ctx = ssl.create_default_context(cafile=str(server.ca))
    out, cut = [], 0
    for _ in range(n):
        try:
            raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            out.append(ctx.wrap_socket(raw, server_hostname="localhost"))
        except OSError:
            cut += 1
    return out, cut


def test_rss_is_bounded_and_flat_and_probes_answer(serve: ServerFactory) -> None:
    server = serve("--max-connections", str(CAP))
    pid = server.process.pid
    start = rss_mb(pid)
    peaks, after = [], []
    for wave in range(WAVES):
        raw = raw_connections(server.port, RAW)
        healthz(server)
        tls, cut = idle_tls_connections(server, IDLE_TLS)
        healthz(server)
        peaks.append(rss_mb(pid))
        for s in (*raw, *tls):
            with contextlib.suppress(OSError):
                s.close()
        healthz(server)
        after.append(settled(pid, after[0] + FLAT_MB if after else None))
        print(f"wave {wave + 1}: RSS {peaks[-1]:.1f} MB with {RAW} raw + {len(tls)} idle TLS "
              f"open ({cut} handshakes cut short), {after[-1]:.1f} MB after closing")
    print(f"RSS at start {start:.1f} MB; peaks {[round(p, 1) for p in peaks]}")
    assert max(peaks) < RSS_BOUND_MB, peaks
    # Flat: once a wave's connections are gone, memory comes back to where the first
    # wave left it. (A peak is how many TLS states are alive at the instant it is read,
    # which depends on how busy the machine is; what is left after a wave does not.)
    assert all(a <= after[0] + FLAT_MB for a in after), after
    assert server.process.poll() is None
