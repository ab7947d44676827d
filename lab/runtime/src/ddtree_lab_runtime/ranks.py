"""One server on several nodes: the rank handshake over TCP that stands in for SGLang's torch.distributed
rendezvous (``--nnodes N --node-rank i --dist-init-addr HEAD:PORT``).

What it keeps of SGLang 0.5.23's behaviour, the part the collection depends on:

- rank 0 (the head) listens on the dist-init port; every other rank connects to it, retrying while the
  head is not up yet, until the join timeout;
- no rank serves, or loads past the rendezvous, before every rank has joined: a head whose workers never
  come waits, then fails ("rank handshake timed out"), as ``init_process_group`` does;
- a peer that dies (its connection closes without a goodbye) is fatal to the others: they take SGLang's
  fatal path (SIGQUIT, SIGKILL of the process tree), so one dead rank takes the whole service down;
- a rank stopped on purpose (SIGTERM) says goodbye first, and its peers exit cleanly (exit 0), so a
  deliberate stop or restart leaves no fatal line in any journal.

Only rank 0 serves HTTP; the other ranks keep their part of the model and wait (launch.py).
The protocol: JSON lines. Worker -> head ``{"hello": RANK, "nnodes": N}``; head -> each worker
``{"ready": true}`` once all joined, or ``{"error": MSG}``; either way ``{"bye": RANK}`` before a clean exit.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Callable, Optional

logger = logging.getLogger("ddtree_lab_runtime")

DEFAULT_JOIN_SECONDS = 120.0
RETRY_SECONDS = 0.5


class RankError(RuntimeError):
    """The group could not form (the message says which rank, and why)."""


def parse_dist_init_addr(value: str) -> tuple:
    """("host", port) of SGLang's --dist-init-addr (HOST:PORT, [V6]:PORT)."""
    host, _, port = (value or "").rpartition(":")
    if not host or not port.isdigit():
        raise RankError(f"--dist-init-addr {value!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


def _read_line(sock: socket.socket, deadline: float) -> Optional[dict]:
    """One JSON line, or None on EOF; RankError past the deadline."""
    data = b""
    while not data.endswith(b"\n"):
        sock.settimeout(max(deadline - time.time(), 0.01))
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            raise RankError("no answer before the join timeout") from None
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


class RankGroup:
    """This process's membership of the group: formed by join(), watched until close()."""

    def __init__(
        self,
        nnodes: int,
        node_rank: int,
        dist_init_addr: str,
        join_seconds: float = DEFAULT_JOIN_SECONDS,
        on_peer_lost: Optional[Callable[[str], None]] = None,
        on_peer_left: Optional[Callable[[str], None]] = None,
    ):
        if not 0 <= node_rank < nnodes:
            raise RankError(f"--node-rank {node_rank} is not in 0..{nnodes - 1} (--nnodes {nnodes})")
        self.nnodes, self.rank = nnodes, node_rank
        self.host, self.port = parse_dist_init_addr(dist_init_addr)
        self.join_seconds = join_seconds
        self.on_peer_lost = on_peer_lost or (lambda message: None)
        self.on_peer_left = on_peer_left or (lambda message: None)
        self.peers: dict = {}  # rank -> socket
        self.closing = False
        self._listener: Optional[socket.socket] = None

    # ---- forming the group ----

    def join(self) -> None:
        """Block until every rank joined (RankError otherwise), then watch the peers."""
        if self.rank == 0:
            self._join_as_head()
        else:
            self._join_as_worker()
        for rank, sock in self.peers.items():
            threading.Thread(target=self._watch, args=(rank, sock), name=f"lab-rank-{rank}", daemon=True).start()

    def _join_as_head(self) -> None:
        listener = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("", self.port))
        except OSError as err:
            raise RankError(f"the dist-init port {self.port} is taken on the head: {err}") from None
        listener.listen(self.nnodes)
        self._listener = listener
        logger.info("Rank 0 waits for %d rank(s) on port %d (--dist-init-addr)", self.nnodes - 1, self.port)
        deadline = time.time() + self.join_seconds
        while len(self.peers) < self.nnodes - 1:
            listener.settimeout(max(deadline - time.time(), 0.01))
            try:
                sock, address = listener.accept()
            except socket.timeout:
                missing = [rank for rank in range(1, self.nnodes) if rank not in self.peers]
                raise RankError(
                    f"rank handshake timed out after {self.join_seconds:g} s: rank(s) {missing} did not join "
                    f"{self.host}:{self.port}"
                ) from None
            try:
                hello = _read_line(sock, deadline) or {}
            except (RankError, ValueError, OSError):
                sock.close()
                continue
            rank, nnodes = hello.get("hello"), hello.get("nnodes")
            problem = None
            if nnodes != self.nnodes:
                problem = f"rank {rank} says --nnodes {nnodes}, the head {self.nnodes}"
            elif not isinstance(rank, int) or not 0 < rank < self.nnodes:
                problem = f"a node says --node-rank {rank}, not in 1..{self.nnodes - 1}"
            elif rank in self.peers:
                problem = f"rank {rank} joined twice (from {address[0]})"
            if problem:
                _send(sock, {"error": problem})
                sock.close()
                raise RankError(problem)
            logger.info("Rank %d joined from %s", rank, address[0])
            self.peers[rank] = sock
        for sock in self.peers.values():
            _send(sock, {"ready": True})
        logger.info("All %d ranks joined: the group is formed", self.nnodes)

    def _join_as_worker(self) -> None:
        deadline = time.time() + self.join_seconds
        logger.info("Rank %d joins the head at %s:%d", self.rank, self.host, self.port)
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(deadline - time.time(), 0.01))
                break
            except OSError as err:
                if time.time() >= deadline:
                    raise RankError(
                        f"rank handshake timed out after {self.join_seconds:g} s: the head at "
                        f"{self.host}:{self.port} did not answer ({err})"
                    ) from None
                time.sleep(RETRY_SECONDS)
        _send(sock, {"hello": self.rank, "nnodes": self.nnodes})
        try:
            answer = _read_line(sock, deadline)
        except RankError:
            raise RankError(
                f"rank handshake timed out after {self.join_seconds:g} s: rank {self.rank} joined the head at "
                f"{self.host}:{self.port}, but the other ranks did not"
            ) from None
        if answer is None:
            raise RankError(f"the head at {self.host}:{self.port} closed the connection before the group formed")
        if "error" in answer:
            raise RankError(f"the head refused rank {self.rank}: {answer['error']}")
        self.peers[0] = sock
        logger.info("Rank %d joined: the group is formed", self.rank)

    # ---- watching and leaving ----

    def _watch(self, rank: int, sock: socket.socket) -> None:
        sock.settimeout(None)
        buffered = b""
        while True:
            try:
                chunk = sock.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                if not self.closing:
                    self.on_peer_lost(f"rank {rank} is gone: its connection closed without a goodbye")
                return
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "bye" in message and not self.closing:
                    self.on_peer_left(f"rank {message['bye']} left the group")
                    return

    def close(self) -> None:
        """Leave on purpose: a goodbye to every peer, so they exit cleanly."""
        self.closing = True
        for sock in self.peers.values():
            try:
                _send(sock, {"bye": self.rank})
                sock.close()
            except OSError:
                pass
        if self._listener is not None:
            self._listener.close()
