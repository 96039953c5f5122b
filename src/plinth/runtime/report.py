"""A unit's reports to the control plane: its state, over the API, with its own credential.

A unit of a workload (an FL server, a middle aggregator) tells its controller what only it knows
(the rounds it has committed, the size of its tree) by `POST /v1/units/report`, authenticated by
a token scoped to that unit's current job attempt (`plinth.control.unitauth`): never the admin
token, and never through files on the control plane's disk, so a unit may run on any host. The
control plane hands both to the unit's job in its environment:

    PLINTH_REPORT_URL   where to post (the control plane's API)
    PLINTH_UNIT_TOKEN   the credential; a unit replaced by a newer attempt is fenced with it
    PLINTH_REPORT_CA    with TLS: the API's certificate (PEM), to verify it by

A report is the unit's whole current state, so only the latest matters: `send` returns at once,
and a thread posts the newest body, again after a failure (the control plane restarting), until
one gets through. `close` waits a little for the last one.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Mapping
from typing import Any

import httpx

log = logging.getLogger("plinth.report")
URL_ENV, TOKEN_ENV, CA_ENV = "PLINTH_REPORT_URL", "PLINTH_UNIT_TOKEN", "PLINTH_REPORT_CA"
RETRY_S = 1.0
FENCED = 409  # the control plane's answer to an attempt that has been replaced


class Reporter:
    def __init__(self, url: str, token: str, *, ca_pem: str | None = None,
                 timeout: float = 10.0) -> None:
        verify: Any = True
        if ca_pem:
            verify = ssl.create_default_context(cadata=ca_pem)
        self._http = httpx.Client(headers={"Authorization": f"Bearer {token}"},
                                  timeout=timeout, verify=verify)
        self.url = url
        self._cv = threading.Condition()
        self._body: Mapping[str, Any] | None = None  # the newest, not yet accepted
        self._closing = False
        self.fenced = False  # told that a newer attempt replaced this one: nothing is sent
        self._thread = threading.Thread(target=self._run, name="plinth-report", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Reporter | None:
        """The unit's reporter, or None outside the platform (run by hand, in a simulation)."""
        url, token = env.get(URL_ENV), env.get(TOKEN_ENV)
        return cls(url, token, ca_pem=env.get(CA_ENV)) if url and token else None

    def send(self, body: Mapping[str, Any]) -> None:
        with self._cv:
            self._body = body
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._body is None and not self._closing:
                    self._cv.wait()
                if self._body is None or self.fenced:
                    return
                body = self._body
            if self._post(body):
                with self._cv:
                    if self._body is body:
                        self._body = None
                    self._cv.notify_all()
            else:
                with self._cv:
                    self._cv.wait(RETRY_S)

    def _post(self, body: Mapping[str, Any]) -> bool:
        try:
            r = self._http.post(self.url, json=dict(body))
        except httpx.HTTPError as e:
            log.warning("report to %s failed (%s); trying again", self.url, e)
            return False
        if r.status_code == FENCED:
            log.warning("report refused: %s", r.text)
            self.fenced = True
            return True
        if r.status_code >= 500:
            return False
        if r.status_code >= 400:  # a bad body is this unit's bug: sending it again won't help
            log.error("report refused (HTTP %d): %s", r.status_code, r.text)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Wait up to `timeout` for the newest report to get through, then stop."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._body is None or self.fenced, timeout)
            self._body = None
            self._cv.notify_all()
        self._thread.join(1.0)
        self._http.close()
