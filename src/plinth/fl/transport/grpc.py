"""gRPC transport: clients pull tasks and push results as streams of chunks.

No protoc step: the service is three methods registered with grpc's generic handlers, and every
frame is plain bytes (the serde buffer, cut into `chunk_size` pieces). A multi-GB model therefore
never becomes one huge gRPC message. Clients dial out to the server (so they may sit behind NAT):

- ``Join``  (unary)          client → its id and properties; server → the chunk size.
- ``Pull``  (server stream)  a JSON header frame, then the task's chunks; or a header saying
                             "nothing yet" (after a long poll) or "shut down".
- ``Push``  (client stream)  a JSON header frame naming the task, then the reply's chunks.
- ``Consent`` (unary)        a client grants, revokes or lists its own consent; the id is the
                             one its token proves, never one it claims (needs tokens).

A pushed reply's size is announced in its header and checked before anything is allocated
for it: one larger than `max_reply` (which the server sets from its model's size, see
`plinth.fl.transport.reply_limit`) is refused with RESOURCE_EXHAUSTED, its task is lost and its client dropped (it
must join again). The chunks are then written straight into the buffer `landing(total)` gives
when the server set it (the aggregator tree's shared-memory slot, which a leaf folds in place),
else into a plain buffer that grows as they arrive, so a client that announces more than it
sends holds only what it sent. At most `max_bodies` pushed replies are held whole at
once (being received, or received and not yet dropped by the server once folded): a push past
that waits, and gRPC's flow control holds its client back. A push that breaks off mid-stream
resolves its task as lost at once, and nothing of it reaches the server: its buffer (a landing
slot too) is freed there and then.

TLS uses the server's certificate and key; clients pin a CA. Per-client tokens come from a file of
``client_id token`` lines; a client proves its id with ``authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from plinth.core.errors import PlinthError, SpecError
from plinth.core.net import bind_hint
from plinth.fl import serde
from plinth.fl.messages import ClientInfo

log = logging.getLogger("plinth.fl.grpc")

SERVICE = "plinth.fl.Fleet"
POLL_SECONDS = 2.0
MAX_MESSAGE = 64 << 30  # refuse pushes announcing more than 64 GiB (before a model is known)


def parse_address(address: str, what: str = "--server", *, any_port: bool = False
                  ) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) or a one-line `SpecError` naming `what`.

    `any_port` admits port 0 (listen on a free port).
    """
    host, sep, port = address.rpartition(":")
    low = 0 if any_port else 1
    if not sep or not host or not port.isdigit() or not low <= int(port) < 65536:
        raise SpecError(f"{what}: expected HOST:PORT with a port {low}-65535, got {address!r}")
    return host, int(port)


def load_tokens(path: str) -> dict[str, str]:
    """token → client id, from lines ``client_id token`` (``#`` starts a comment)."""
    out: dict[str, str] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise SpecError(f"transport.tokens: cannot read {path} ({e.strerror})") from None
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise SpecError(f"{path}:{n}: expected 'client_id token'")
        out[parts[1]] = parts[0]
    return out


def message_options(chunk_size: int) -> list[tuple[str, int]]:
    """gRPC channel/server options that admit one chunk (plus its framing) per message."""
    return [("grpc.max_receive_message_length", chunk_size + (1 << 16)),
            ("grpc.max_send_message_length", chunk_size + (1 << 16))]


def listen(server: grpc.Server, target: str, cert: bytes | None, key: bytes | None) -> int:
    """Bind `server` to `target` (TLS when both cert and key are given); the port, or a
    one-line `PlinthError`."""
    try:
        if cert is not None and key is not None:
            port = server.add_secure_port(target, grpc.ssl_server_credentials([(key, cert)]))
        else:
            port = server.add_insecure_port(target)
    except RuntimeError:  # grpcio raises where it used to return 0
        port = 0
    if port == 0:
        raise PlinthError(f"--address: cannot listen on {target}{bind_hint(target)}")
    return port


RECONNECT_MAX_MS = 2000
# Waiting for the server covers a server not there yet, not a connection that breaks under a
# Join (a server killed as its clients rejoin it): that fails at once with UNAVAILABLE, so
# gRPC tries it again (within the call's deadline, waiting for the server each time).
_JOIN_RETRY = json.dumps({"methodConfig": [{
    "name": [{"service": SERVICE, "method": "Join"}],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.2s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})


def open_channel(address: str, ca: bytes | None, chunk_size: int) -> grpc.Channel:
    """A channel to `address`, pinning the CA `ca` when given (else plaintext). A server (or
    middle aggregator) that died is tried again at least every RECONNECT_MAX_MS, so that its
    replacement on the same address is found within seconds, not gRPC's default 2 minutes."""
    opts = [*message_options(chunk_size), ("grpc.max_reconnect_backoff_ms", RECONNECT_MAX_MS),
            ("grpc.service_config", _JOIN_RETRY)]
    if ca is not None:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(ca), opts)
    return grpc.insecure_channel(address, opts)


def token_owner(tokens: dict[str, str], context: grpc.ServicerContext) -> str | None:
    """The id whose token the call's ``authorization: Bearer`` header carries, or None."""
    md = dict(context.invocation_metadata())
    token = str(md.get("authorization", "")).removeprefix("Bearer ").strip()
    for known, cid in tokens.items():
        if hmac.compare_digest(known.encode(), token.encode()):
            return cid
    return None


def read_pem(path: str | None, what: str) -> bytes | None:
    """The bytes of a TLS file named by the app spec's field `what` (None: not set)."""
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise SpecError(f"{what}: cannot read {path} ({e.strerror})") from None


@dataclass(slots=True)
class _Task:
    id: int
    payload: bytes | bytearray
    future: Future


@dataclass(slots=True)
class _Peer:
    info: ClientInfo
    tasks: queue.Queue = field(default_factory=queue.Queue)
    last_seen: float = 0.0


class _Body(bytearray):
    """A pushed reply; when the server drops it (and every view of it), its place is free."""

    __slots__ = ("__weakref__",)


class GrpcTransport:
    """The server end. `submit` queues a task for one client; its future gets the reply bytes."""

    def __init__(self, address: str, *, tokens: dict[str, str] | None = None,
                 cert: bytes | None = None, key: bytes | None = None,
                 chunk_size: int = 1 << 20, workers: int = 32,
                 liveness: float = 4 * POLL_SECONDS,
                 consent: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
                 max_bodies: int = 8, body_wait: float = 600.0) -> None:
        host, port = parse_address(address, "--address", any_port=True)
        self.tokens, self.chunk_size, self.liveness = tokens, chunk_size, liveness
        # consent(authenticated client id, request) -> reply; ValueError: a refused request
        self.consent = consent
        self._peers: dict[str, _Peer] = {}
        self._pending: dict[int, tuple[str, Future]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Condition()
        self._closing = False
        self._told: set[str] = set()
        self._room = threading.BoundedSemaphore(max(1, max_bodies))
        self.body_wait = body_wait
        # where a reply of `total` bytes is received, set by the server for a round (see
        # `Accumulator.landing`); None, or None from it: a plain buffer
        self.landing: Callable[[int], Any] | None = None
        # the largest reply a push may announce; the server sets it from its model's size
        self.max_reply = MAX_MESSAGE
        self.bodies = 0  # whole replies held now ...
        self.peak_bodies = 0  # ... and at most, so far
        self._server = grpc.server(ThreadPoolExecutor(workers),
                                   options=message_options(chunk_size))
        handlers = {
            "Join": grpc.unary_unary_rpc_method_handler(self._join),
            "Pull": grpc.unary_stream_rpc_method_handler(self._pull),
            "Push": grpc.stream_unary_rpc_method_handler(self._push),
            "Consent": grpc.unary_unary_rpc_method_handler(self._consent),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self.port = listen(self._server, f"{host}:{port}", cert, key)
        self._server.start()

    # -- authentication -------------------------------------------------------------------------

    def _who(self, context: grpc.ServicerContext, claimed: str) -> str:
        if self.tokens is None:
            return claimed
        cid = token_owner(self.tokens, context)
        if cid is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown or missing client token")
            raise AssertionError  # abort raises
        if claimed and claimed != cid:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"token belongs to {cid!r}, not {claimed!r}")
        return cid

    # -- RPC handlers ---------------------------------------------------------------------------

    def _join(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            hello = json.loads(request)
            claimed, props = str(hello.get("client_id") or ""), dict(hello.get("properties", {}))
        except (ValueError, AttributeError, TypeError):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Join: request is not JSON")
            raise
        cid = self._who(context, claimed)
        if not cid:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Join: client_id is required")
        with self._lock:
            peer = self._peers.get(cid)
            if peer is None:
                peer = self._peers[cid] = _Peer(ClientInfo(cid, props))
            peer.info.properties = props
            peer.last_seen = time.monotonic()
            self._lock.notify_all()
        log.info("client %s joined", cid)
        return json.dumps({"client_id": cid, "chunk_size": self.chunk_size}).encode()

    def _consent(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if self.consent is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server's task asks no consent")
        if self.tokens is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "consent is bound to a client's "
                          "token, and this server has no transport.tokens")
        cid = self._who(context, "")
        try:
            req = json.loads(request)
            if not isinstance(req, dict):
                raise TypeError("request is not a JSON object")
            reply = self.consent(cid, req)  # type: ignore[misc]
        except (ValueError, TypeError, KeyError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Consent: {e}")
            raise
        log.info("consent %s by client %s", req.get("action"), cid)
        return json.dumps(reply).encode()

    def _pull(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        cid = self._who(context, json.loads(request).get("client_id", ""))
        with self._lock:
            peer = self._peers.get(cid)
            if peer is not None:
                peer.last_seen = time.monotonic()
        if peer is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"client {cid!r} has not joined")
        if self._closing:
            yield json.dumps({"shutdown": True}).encode()
            return
        deadline = time.monotonic() + POLL_SECONDS
        while True:
            try:
                task = peer.tasks.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                yield json.dumps({"shutdown": self._closing, "wait": True}).encode()
                return
            if task.id < 0:  # the server is closing: tell this client at once
                yield json.dumps({"shutdown": True}).encode()
                with self._lock:
                    self._told.add(cid)
                    self._lock.notify_all()
                return
            if task.future.set_running_or_notify_cancel():
                break  # a task the server cancelled (straggler timeout) is dropped here
        yield json.dumps({"task": task.id, "total": len(task.payload)}).encode()
        sent = False
        try:
            yield from serde.chunks(task.payload, self.chunk_size)
            sent = True
        finally:
            if not sent:  # the client went away mid-stream (GeneratorExit): a lost task
                self._resolve(task.id, error="stream to client broke")

    def _push(self, frames: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        try:
            head = json.loads(next(frames))
            task_id, total = int(head["task"]), int(head["total"])
        except (StopIteration, ValueError, KeyError, TypeError):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Push: first frame must be a header")
            raise
        cid = self._who(context, str(head.get("client_id", "")))
        with self._lock:
            owner = self._pending.get(task_id)
            if cid in self._peers:
                self._peers[cid].last_seen = time.monotonic()
        if owner is None or owner[0] != cid:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Push: no open task {task_id} for {cid!r}")
        if total < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Push: bad size {total}")
        limit = min(self.max_reply, MAX_MESSAGE)
        if total > limit:  # refused before anything is allocated for it
            why = (f"Push: a reply of {total} bytes announced, more than the {limit} a reply "
                   f"to this task can take (from the model's size); client {cid!r} dropped")
            log.warning("%s", why)
            with self._lock:
                self._peers.pop(cid, None)  # it must join again to be given a task
            self._resolve(task_id, error=why)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
        if not self._room.acquire(timeout=self.body_wait):
            self._resolve(task_id, error=f"no room for the reply within {self.body_wait:g}s")
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Push: the server is full")
        self._held(+1)
        body = None
        try:
            body = self._buffer(total)
            if isinstance(body, _Body):  # grown as the chunks come, up to `total`
                serde.join(frames, total, out=body)
            else:  # the server's landing slot, of the announced size
                serde.join_into(frames, body)
        except Exception as e:  # a corrupt or broken-off stream (any error): a lost task
            # the partial upload is dropped here, never handed to the server; the finished
            # frames' views of it go first, so that its room (and slot) are free at once
            traceback.clear_frames(e.__traceback__)
            if body is None:
                self._freed()
            body = None
            why = str(e) if isinstance(e, serde.SerdeError) else \
                f"upload broke off ({type(e).__name__})"
            self._resolve(task_id, error=why)
            if isinstance(e, serde.SerdeError):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
            raise
        self._resolve(task_id, body=body)
        return b"{}"

    def _buffer(self, total: int) -> Any:
        """The buffer a reply is received into: a landing slot of `total` bytes, else an empty
        one that grows as the reply comes; its room is freed when it (every view of it) dies."""
        land = self.landing
        body = land(total) if land is not None else None
        if body is None:
            body = _Body()
        weakref.finalize(body, self._freed)
        return body

    def _held(self, n: int) -> None:
        with self._lock:
            self.bodies += n
            self.peak_bodies = max(self.peak_bodies, self.bodies)

    def _freed(self) -> None:
        self._held(-1)
        self._room.release()

    def _resolve(self, task_id: int, *, body: Any = None, error: str = "") -> None:
        with self._lock:
            got = self._pending.pop(task_id, None)
        if got is None or got[1].done():
            return
        if body is not None:
            got[1].set_result(body)
        else:
            got[1].set_exception(PlinthError(error))

    # -- Transport ------------------------------------------------------------------------------

    def clients(self) -> list[ClientInfo]:
        now = time.monotonic()
        with self._lock:
            return [p.info for p in self._peers.values() if now - p.last_seen <= self.liveness]

    def wait_for(self, n: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._lock:
            while len(self.clients()) < n:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.5))
        return True

    def submit(self, cid: str, payload: bytes | bytearray) -> Future:
        fut: Future = Future()
        task = _Task(next(self._ids), payload, fut)
        with self._lock:
            peer = self._peers.get(cid)
            if peer is None:
                fut.set_exception(PlinthError(f"client {cid!r} is not connected"))
                return fut
            self._pending[task.id] = (cid, fut)
        peer.tasks.put(task)
        return fut

    def close(self, grace: float = POLL_SECONDS + 1) -> None:
        """Tell every client to shut down (waking their polls), then stop serving."""
        self._closing = True
        with self._lock:
            live = {p.info.cid for p in self._peers.values()
                    if time.monotonic() - p.last_seen <= self.liveness}
            for peer in self._peers.values():
                peer.tasks.put(_Task(-1, b"", Future()))
            end = time.monotonic() + grace
            while not live <= self._told and time.monotonic() < end:
                self._lock.wait(0.1)
            for _, fut in self._pending.values():
                fut.cancel()
            self._pending.clear()
        self._server.stop(grace=0.5).wait()


# Answers that asking again would only repeat: they end a client.
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED,
            grpc.StatusCode.RESOURCE_EXHAUSTED)


LOCATE_S = 5.0  # with `locate`, a client that lost its server asks where it is this often


class GrpcClient:
    """The client end: join, then pull tasks, hand each to `handle`, push the reply back.

    `locate` (optional) says where the server is now, or None while that is not known (a
    client of an FL task on the platform asks the control plane): a client that lost its
    server asks it again, so that it finds a server started again elsewhere."""

    def __init__(self, address: str, *, client_id: str, token: str | None = None,
                 ca: bytes | None = None, properties: dict[str, Any] | None = None,
                 chunk_size: int = 1 << 20, connect_timeout: float = 30.0,
                 locate: Callable[[], str | None] | None = None) -> None:
        parse_address(address)
        self.client_id, self.properties = client_id, properties or {}
        self.metadata = [("authorization", f"Bearer {token}")] if token else []
        self.chunk_size, self.connect_timeout = chunk_size, connect_timeout
        self.ca, self.locate = ca, locate
        self._open(address)

    def _open(self, address: str) -> None:
        self.channel = open_channel(address, self.ca, self.chunk_size)
        self.address = address
        self._join = self.channel.unary_unary(f"/{SERVICE}/Join")
        self._consent = self.channel.unary_unary(f"/{SERVICE}/Consent")
        self._pull = self.channel.unary_stream(f"/{SERVICE}/Pull")
        self._push = self.channel.stream_unary(f"/{SERVICE}/Push")

    def _call_error(self, e: grpc.RpcError, what: str) -> PlinthError:
        code = e.code() if hasattr(e, "code") else None
        detail = e.details() if hasattr(e, "details") else str(e)
        return PlinthError(f"{what} {self.address}: {getattr(code, 'name', code)}: {detail}")

    def join(self) -> dict[str, Any]:
        try:
            return self._hello(self.connect_timeout)
        except grpc.RpcError as e:
            raise self._call_error(e, "--server: cannot join") from None

    def _hello(self, timeout: float) -> dict[str, Any]:
        hello = json.dumps({"client_id": self.client_id, "properties": self.properties}).encode()
        reply = self._join(hello, metadata=self.metadata, wait_for_ready=True, timeout=timeout)
        info = json.loads(reply)
        self.client_id = info["client_id"]
        return info

    def rejoin(self) -> None:
        """Join again after the server went away, waiting up to `connect_timeout` for it; with
        `locate`, asking every LOCATE_S where it is now, and dialling it there."""
        if self.locate is None:
            self.join()
            return
        deadline = time.monotonic() + self.connect_timeout
        while True:
            where = self.locate()
            if where and where != self.address:
                log.info("the server is at %s now (was %s)", where, self.address)
                self.channel.close()
                self._open(where)
            try:
                self._hello(max(0.1, min(LOCATE_S, deadline - time.monotonic())))
                return
            except grpc.RpcError as e:
                if e.code() in _REFUSED or time.monotonic() >= deadline:
                    raise self._call_error(e, "--server: cannot join") from None

    def consent(self, request: dict[str, Any]) -> dict[str, Any]:
        """Grant, revoke or list this client's consent on the server (as its token's id)."""
        try:
            reply = self._consent(json.dumps(request).encode(), metadata=self.metadata,
                                  wait_for_ready=True, timeout=self.connect_timeout)
        except grpc.RpcError as e:
            raise self._call_error(e, "--server: consent refused by") from None
        return json.loads(reply)

    def serve(self, handle: Any, stop: threading.Event | None = None) -> int:
        """Run tasks until the server says to shut down; returns how many were run."""
        self.join()
        ran = 0
        req = json.dumps({"client_id": self.client_id}).encode()
        while stop is None or not stop.is_set():
            try:
                # A pull waits for a server that is away to come back at this address; with
                # `locate` it fails at once instead, and the client asks where the server is.
                frames = iter(self._pull(req, metadata=self.metadata,
                                         wait_for_ready=self.locate is None,
                                         timeout=POLL_SECONDS * 5 + self.connect_timeout))
                head = json.loads(next(frames))
                if head.get("shutdown"):
                    break
                if head.get("wait"):
                    continue
                payload = serde.join(frames, int(head["total"]))
            except grpc.RpcError as e:
                # A refusal ends the client; anything else is a server gone away or going:
                # a stream broken under way reads as UNAVAILABLE, CANCELLED, INTERNAL or
                # UNKNOWN depending on where it broke.
                if e.code() in _REFUSED:
                    raise self._call_error(e, "--server: lost") from None
                # A server that finishes says so; one that vanished may be restarting with
                # --resume (and then does not know us yet), here or elsewhere: join again,
                # waiting up to connect_timeout for it.
                try:
                    self.rejoin()
                except PlinthError:
                    if ran:
                        break
                    raise
                continue
            reply = handle(payload)
            header = json.dumps({"task": head["task"], "total": len(reply),
                                 "client_id": self.client_id}).encode()
            try:
                self._push(itertools.chain([header], serde.chunks(reply, self.chunk_size)),
                           metadata=self.metadata, timeout=600)
            except grpc.RpcError as e:
                log.warning("push of task %s failed: %s", head["task"], e)
            ran += 1
        self.channel.close()
        return ran
