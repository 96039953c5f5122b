"""Federated learning: the model goes to the data, and only updates come back.

Layout (roles first, as `ls` shows them):

- `messages`, `serde`: the message dataclasses and their byte encoding (zero-copy on the way in);
- `server`, `client`: the server loop (rounds, selection, timeouts, checkpoints) and the client
  runner; `transport/` moves bytes between them (`inproc` for simulation, `grpc` for real);
- `strategies/`: one file per strategy (FedAvg, FedProx, FedAvgM, FedAdam/FedYogi/FedAdagrad,
  FedBuff, FedAsync); `aggregate/`: the streaming engine and the LIFL-style hierarchy;
- `compress`, `data`, `app` (the YAML spec), `sim`, `deploy`, `checkpoint`.

Importing this package does not import torch; only the PyTorch glue (`torch_client`) does.
"""

from plinth.fl.messages import (
    ClientInfo,
    Config,
    ErrorRes,
    EvaluateIns,
    EvaluateRes,
    Failure,
    FitIns,
    FitRes,
    Metrics,
    NDArray,
    NDArrays,
)

__all__ = ["ClientInfo", "Config", "ErrorRes", "EvaluateIns", "EvaluateRes", "Failure", "FitIns",
           "FitRes", "Metrics", "NDArray", "NDArrays"]
