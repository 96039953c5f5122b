"""A handler for `examples.serve.cnn:make`: JSON images in, Fashion-MNIST labels out.

    POST /infer {"images": [[[0..255, ...28 values], ...28 rows], ...]}
    -> {"labels": ["ankle boot", ...], "scores": [0.91, ...]}

Serve it with `handler: examples.serve.handler:Handler` next to `model: examples.serve.cnn:make`
(input_shape 1,28,28). `preprocess` raises with the reason on a payload it cannot use;
the replica answers that with 400.
"""

from __future__ import annotations

from typing import Any

import torch

LABELS = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
          "ankle boot")
SIDE = 28
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's pixel statistics, on the 0..1 scale


class Handler:
    def preprocess(self, payload: Any) -> torch.Tensor:
        """{"images": a list of 28x28 grey images, 0..255} -> a normalised (N, 1, 28, 28) batch."""
        if not isinstance(payload, dict) or not isinstance(payload.get("images"), list):
            raise TypeError('images: expected {"images": [28x28 image, ...]}')
        try:
            x = torch.tensor(payload["images"], dtype=torch.float32)
        except (TypeError, ValueError) as e:
            raise ValueError(f"images: not a list of 28x28 number grids ({e})") from e
        if x.ndim != 3 or tuple(x.shape[1:]) != (SIDE, SIDE):
            raise ValueError(f"images: expected N images of 28x28, got shape {tuple(x.shape)}")
        return ((x / 255 - MEAN) / STD).unsqueeze(1)

    def postprocess(self, outputs: torch.Tensor) -> dict[str, list]:
        """Logits (N, 10) -> each image's label and its softmax score."""
        p = outputs.softmax(dim=1)
        score, k = p.max(dim=1)
        return {"labels": [LABELS[i] for i in k.tolist()],
                "scores": [round(s, 4) for s in score.tolist()]}
