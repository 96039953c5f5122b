"""Site-to-site exchange over gRPC, for protocols without a server (decentralised ADMM).

Every site runs a small gRPC server on its own address and dials its peers. The service has one
client-streaming method, registered with generic handlers as in `plinth.fl.transport.grpc`:

- ``Send``  a JSON header frame ``{"sender": i, "seq": n, "total": bytes}``, then the chunks of a
            serde buffer (`serde.arrays_to_bytes` of one array).

Messages from each peer are numbered 1, 2, 3, ...; the receiver queues them per sender (FIFO), so
`recv(peer)` returns that peer's messages in the order they were sent, or raises a one-line
`PlinthError` naming the peer after `timeout` seconds. With ``tokens`` (token → site id, as
`grpc.load_tokens` reads them) a sender proves its id with ``authorization: Bearer <token>``; TLS
uses a certificate and key on the server side and a pinned CA on the dialling side.

The receiver refuses, logs (and keeps in ``rejected``) without stopping: a bad or missing token, a
sender that is not one of its peers or that is not the token's owner, a sequence number it has
already accepted (a replay) or one that skips ahead, and a malformed header or body.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl import serde
from plinth.fl.transport.grpc import (
    listen,
    message_options,
    open_channel,
    parse_address,
    token_owner,
)

log = logging.getLogger("plinth.fl.peer")

SERVICE = "plinth.fl.Peer"
MAX_PEER_MESSAGE = 16 << 30  # refuse messages announcing more than 16 GiB


class PeerExchange:
    """One site's end of the mesh: a server for inbound messages, a channel to each peer.

    Sites are numbered 0..sites-1. Create every site's exchange (each binds its port and accepts
    messages from then on), then give each the full address list with `connect`. `send` returns
    once the peer has queued the message.
    """

    def __init__(self, me: int, sites: int, address: str = "127.0.0.1:0", *,
                 tokens: dict[str, str] | None = None, token: str | None = None,
                 cert: bytes | None = None, key: bytes | None = None, ca: bytes | None = None,
                 chunk_size: int = 1 << 20, timeout: float = 120.0, workers: int = 16,
                 audit: bool = False) -> None:
        host, port = parse_address(address, "--listen", any_port=True)
        self.me, self.tokens, self.chunk_size, self.timeout = me, tokens, chunk_size, timeout
        self.ca = ca
        self.metadata = [("authorization", f"Bearer {token}")] if token else []
        if not 0 <= me < sites:
            raise PlinthError(f"--site: must be in 0..{sites - 1}, got {me}")
        self.peers = frozenset(i for i in range(sites) if i != me)
        self.rejected: list[str] = []
        # with `audit`: every accepted message as (sender, seq, array), to check what a site saw
        self.audit_log: list[tuple[int, int, np.ndarray]] | None = [] if audit else None
        self._inbox: dict[int, queue.Queue[np.ndarray]] = {p: queue.Queue() for p in self.peers}
        self._last_seq = dict.fromkeys(self.peers, 0)
        self._next_seq: dict[int, itertools.count] = {}
        self._channels: dict[int, grpc.Channel] = {}
        self._stubs: dict[int, grpc.StreamUnaryMultiCallable] = {}
        self._addresses: list[str] = []
        self._lock = threading.Lock()
        self._server = grpc.server(ThreadPoolExecutor(workers),
                                   options=message_options(chunk_size))
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            SERVICE, {"Send": grpc.stream_unary_rpc_method_handler(self._receive)}),))
        self.port = listen(self._server, f"{host}:{port}", cert, key)
        self.address = f"{host}:{self.port}"
        self._server.start()

    def connect(self, addresses: Sequence[str]) -> None:
        """Site i listens at ``addresses[i]``; every other entry is a peer."""
        if len(addresses) != len(self.peers) + 1:
            raise PlinthError(f"--peers: expected {len(self.peers) + 1} addresses (one per site), "
                              f"got {len(addresses)}")
        for i, a in enumerate(addresses):
            parse_address(a, f"--peers[{i}]")
        self._addresses = list(addresses)
        for p in self.peers:
            self._channels[p] = open_channel(addresses[p], self.ca, self.chunk_size)
            self._stubs[p] = self._channels[p].stream_unary(f"/{SERVICE}/Send")
            self._next_seq[p] = itertools.count(1)

    # -- Exchange --------------------------------------------------------------------------------

    def send(self, peer: int, payload: np.ndarray) -> None:
        if peer not in self._stubs:
            raise PlinthError(f"site {self.me}: site {peer} is not a peer")
        body = serde.arrays_to_bytes([np.asarray(payload)])
        header = json.dumps({"sender": self.me, "seq": next(self._next_seq[peer]),
                             "total": len(body)}).encode()
        frames = itertools.chain([header], serde.chunks(body, self.chunk_size))
        try:
            self._stubs[peer](frames, metadata=self.metadata, wait_for_ready=True,
                              timeout=self.timeout)
        except grpc.RpcError as e:
            code = getattr(e.code(), "name", e.code())
            raise PlinthError(f"site {self.me}: cannot send to site {peer} at "
                              f"{self._addresses[peer]}: {code}: {e.details()}") from None

    def recv(self, peer: int) -> np.ndarray:
        box = self._inbox.get(peer)
        if box is None:
            raise PlinthError(f"site {self.me}: site {peer} is not a peer")
        try:
            return box.get(timeout=self.timeout)
        except queue.Empty:
            raise PlinthError(f"site {self.me}: no message from site {peer} within "
                              f"{self.timeout:g}s") from None

    def close(self, grace: float = 1.0) -> None:
        for ch in self._channels.values():
            ch.close()
        self._server.stop(grace=grace).wait()

    # -- the Send handler ------------------------------------------------------------------------

    def _refuse(self, context: grpc.ServicerContext, code: grpc.StatusCode, why: str) -> None:
        log.warning("site %s refused a message from %s: %s", self.me, context.peer(), why)
        with self._lock:
            self.rejected.append(why)
        context.abort(code, why)

    def _receive(self, frames: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        try:
            head = json.loads(next(frames))
            sender, seq, total = int(head["sender"]), int(head["seq"]), int(head["total"])
        except (StopIteration, ValueError, KeyError, TypeError):
            self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                         "malformed frame: the first frame must be a JSON header")
            raise AssertionError from None  # abort raises
        if self.tokens is not None:
            owner = token_owner(self.tokens, context)
            if owner is None:
                self._refuse(context, grpc.StatusCode.UNAUTHENTICATED,
                             f"unknown or missing token (claimed sender {sender})")
            if owner != str(sender):
                self._refuse(context, grpc.StatusCode.PERMISSION_DENIED,
                             f"token belongs to site {owner}, not {sender}")
        if sender not in self.peers:
            self._refuse(context, grpc.StatusCode.PERMISSION_DENIED,
                         f"unknown site {sender}")
        if not 0 <= total <= MAX_PEER_MESSAGE:
            self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"malformed frame: bad size {total} from site {sender}")
        try:
            arrays = serde.arrays_from_bytes(serde.join(frames, total))
            if len(arrays) != 1:
                raise serde.SerdeError(f"expected one array, got {len(arrays)}")
        except serde.SerdeError as e:
            self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"malformed frame from site {sender}: {e}")
            raise AssertionError from None
        with self._lock:
            last = self._last_seq[sender]
            if seq == last + 1:
                self._last_seq[sender] = seq
                self._inbox[sender].put(arrays[0])
                if self.audit_log is not None:
                    self.audit_log.append((sender, seq, arrays[0]))
                return b"{}"
        why = "replayed" if seq <= last else "out-of-order"
        self._refuse(context, grpc.StatusCode.ALREADY_EXISTS if seq <= last
                     else grpc.StatusCode.FAILED_PRECONDITION,
                     f"{why} sequence number {seq} from site {sender} (last accepted {last})")
        raise AssertionError
