"""One model replica: a small PyTorch model behind HTTP, run as its own process.

    python -m plinth.serve.replica --port 9001 --model tiny-cnn

POST /infer with {"inputs": [[...], ...]} (a batch of flattened 28×28 images, or any length that
the model reshapes) returns {"classes": [...]}. GET /healthz answers once the model is loaded.
The weights are seeded, so every replica answers the same; one torch thread per replica, matching
one CPU per replica.
"""

from __future__ import annotations

import argparse

import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from plinth.serve.spec import MODELS

SIDE = 28


def tiny_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, SIDE, SIDE)),
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(SIDE * SIDE, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def build_model(name: str) -> torch.nn.Module:
    """The model `name` (see plinth.serve.spec.MODELS), with seeded weights."""
    torch.manual_seed(0)
    return MODELS.make(name).eval()


class InferRequest(BaseModel):
    inputs: list[list[float]]


def make_app(model_name: str) -> FastAPI:
    net = build_model(model_name)
    app = FastAPI(title=f"plinth replica ({model_name})")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "model": model_name}

    @app.post("/infer")
    def infer(req: InferRequest) -> dict[str, list[int]]:
        # A sync handler: FastAPI runs it in a worker thread; torch uses one intra-op thread.
        x = torch.tensor(req.inputs, dtype=torch.float32)
        if x.ndim != 2 or x.shape[1] != SIDE * SIDE:
            raise HTTPException(422, f"inputs: expected rows of {SIDE * SIDE} numbers")
        with torch.inference_mode():
            return {"classes": net(x).argmax(dim=1).tolist()}

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description="one plinth model replica")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="tiny-cnn")
    args = ap.parse_args()
    torch.set_num_threads(1)
    uvicorn.run(make_app(args.model), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
