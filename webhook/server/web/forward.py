"""Relaying a review to the replica that decides GPU quota (``--quota-commit leader``).

With the quota decided in the leader's memory (``webhook.quota.decider``), a replica that
does not lead sends each review that may reserve quota (a real, not dry-run, review) to
the leader as it came, and answers the API server with the leader's answer, byte for
byte. The leader's address is the one it writes in the leader Lease
(``Leadership.leader_address``); its certificate is checked against the CA the replicas
share and the Service's DNS name (the address is a pod IP, which the certificate does
not name).

A relay that fails (no leader known, the leader gone, no answer in time) is not an
answer: the review is then decided here, where a quota commit is refused saying that no
replica decides quota now (``NotDeciding``), so nothing is ever admitted uncounted. A
relayed review carries :data:`RELAYED`, and a replica never relays a review that did:
two replicas that each think the other leads refuse rather than loop.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable

import httpx

from webhook.libs import logs

RELAYED = "x-gpu-webhook-relayed"  # a header: this review was relayed once already

# httpx logs every request at INFO: a line per relayed review, besides the decision's.
logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpcore").setLevel(logging.WARNING)


class Relay:
    """Sends a review's body to the leader and returns its answer (status, body)."""

    def __init__(self, leader: Callable[[], str], ca_file: str,
                 server_name: str | None = None) -> None:
        self.leader = leader  # the leader's https:// base URL; "" when none or this one
        self.server_name = server_name
        self.ca_file = ca_file
        self._ca_seen = _stamp(ca_file)
        self._client = _client(ca_file)
        self._failing = ""

    def target(self) -> str:
        return self.leader()

    async def send(self, base: str, path: str, body: bytes, timeout: float
                   ) -> tuple[int, bytes] | None:
        """The leader's answer to ``body`` POSTed to ``path``, or None when it gave none
        within ``timeout`` seconds (logged once while it lasts)."""
        extensions = {"sni_hostname": self.server_name} if self.server_name else None
        await self._follow_ca()
        try:
            resp = await self._client.post(
                base + path, content=body, timeout=timeout, extensions=extensions,
                headers={"content-type": "application/json", RELAYED: "1"})
        except httpx.HTTPError as exc:
            self._log(base, f"{type(exc).__name__}: {exc}")
            return None
        if resp.status_code != 200:
            self._log(base, f"HTTP {resp.status_code}")
            return None
        self._failing = ""
        return resp.status_code, resp.content

    def _log(self, base: str, error: str) -> None:
        if error != self._failing:
            logs.event("review not relayed to the leader; decided here (quota commits are "
                       "refused until a leader answers)", logging.WARNING, leader=base,
                       error=error)
        self._failing = error

    async def _follow_ca(self) -> None:
        """A new CA file (a mounted Secret updated, a self-managed CA rolled over) is
        what the next relay checks the leader by: the pool is made again on it."""
        seen = _stamp(self.ca_file)
        if seen == self._ca_seen:
            return
        try:
            fresh = _client(self.ca_file)
        except (OSError, ssl.SSLError) as exc:  # half-written, or not a CA: keep the last
            logs.event("the leader's CA file changed but cannot be read; the last one read "
                       "checks the leader", logging.WARNING, ca_file=self.ca_file,
                       error=str(exc))
            self._ca_seen = seen  # said once per change
            return
        old, self._client, self._ca_seen = self._client, fresh, seen
        await old.aclose()

    async def close(self) -> None:
        await self._client.aclose()


def _client(ca_file: str) -> httpx.AsyncClient:
    context = ssl.create_default_context(cafile=ca_file)
    # One pool of kept-alive connections to the leader: a relay costs a request, not a
    # TLS handshake.
    return httpx.AsyncClient(verify=context, http1=True, http2=False,
                             limits=httpx.Limits(max_keepalive_connections=32))


def _stamp(path: str) -> tuple[int, int, int] | None:
    """What tells a changed file: its inode (a Secret's update swaps a symlink; ours
    renames a new file in), size and modification time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
