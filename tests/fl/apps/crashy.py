"""Like tiny.py, but client 0 kills its worker process once (as a segfaulting library would)."""

import os
from pathlib import Path

from torch import nn

from plinth.fl.torch_client import make_default_client


def make_model(spec):
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


class _Crashes:
    def __init__(self, inner, marker):
        self.inner, self.marker = inner, marker

    def fit(self, parameters, config):
        if not self.marker.exists():
            self.marker.write_text("crashed")
            os._exit(1)
        return self.inner.fit(parameters, config)

    def evaluate(self, parameters, config):
        return self.inner.evaluate(parameters, config)


def make_client(cid, train, test, spec):
    inner = make_default_client(make_model(spec), train, test, spec.train, cid)
    return _Crashes(inner, Path(spec.base_dir) / "crashed.marker") if cid == 0 else inner
