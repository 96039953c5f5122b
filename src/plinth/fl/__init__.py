"""Federated learning: the model goes to the data, and only updates come back.

Layout (roles first, as `ls` shows them):

- `messages`, `serde`: the message dataclasses and their byte encoding (zero-copy on the way in);
- `server`, `client`, `middle`: the server loop (rounds, timeouts, the round's accumulator and
  aggregator tree, checkpoints), the client runner, and a machine's middle aggregator;
  `transport/` moves bytes between them (`inproc` and `ray` for simulation, `grpc` for real);
- `rounds`: the server's whole life on a transport, which `sim` (the simulation) and `deploy`
  (`plinth fl server` and friends, the FLTask's units) both run; `results`: its summary;
- `strategies/`: one file per strategy (FedAvg, FedProx, FedAvgM, FedAdam/FedYogi/FedAdagrad,
  FedBuff, FedAsync); `selection`: who takes part in a round; `aggregate/`: the streaming
  engine and the LIFL-style hierarchy;
- `compress`, `data`, `app` (the YAML spec), `checkpoint`, `workload` (the FLTask controller).

No module here starts a process: see `plinth.runtime.pool`.

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
