"""The models a replica serves by name (`plinth.serve.model` builds them; torch is imported on
first use, so that a spec can name them without it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plinth.core.registry import Registry

MODELS: Registry[Callable[[], Any]] = Registry("model")  # -> a torch.nn.Module
MODELS.add("tiny-cnn", "plinth.serve.model:tiny_cnn")
MODELS.add("mlp", "plinth.serve.model:mlp")
