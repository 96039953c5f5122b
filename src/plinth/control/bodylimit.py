"""A cap on request bodies, checked before a byte of the body is read.

A body must declare its length (Content-Length); one over the cap is answered 413 with the
limit, one that does not say how long it is 411. HTTP/1.1 servers deliver no more than the
declared length, so the declared length is the body's size.
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_MAX_BODY_BYTES = 1 << 20  # a job spec is a few KiB; 1 MiB leaves room for big envs


class BodyLimit:
    """ASGI middleware: `app.add_middleware(BodyLimit, max_bytes=N)`."""

    def __init__(self, app: Any, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = dict(scope["headers"])
            length = headers.get(b"content-length")
            if length is None and b"chunked" in headers.get(b"transfer-encoding", b""):
                return await _refuse(send, 411, "a request body must declare its length "
                                                "(Content-Length)")
            if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
                return await _refuse(send, 413, f"request body is {length.decode(errors='replace')}"
                                                f" bytes; the limit is {self.max_bytes} bytes "
                                                "(plinth up --max-body)")
        await self.app(scope, receive, send)


async def _refuse(send: Any, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
