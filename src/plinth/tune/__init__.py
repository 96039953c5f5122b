"""Share-aware autotuning after SLICE-TUNE: tune a model with TVM MetaSchedule at the GPU or CPU
share it will run at, on tuning servers that share a device, with the model's tasks sharded
across tuning clients.

- `spec`: the `kind: Tune` spec; `controller`: its runtime units (tracker, servers, clients);
- `tracker`, `server`, `client`: the units' entry points (`python -m plinth.tune.<unit>`);
  `reports`: what they report to the controller (where they listen, what they tuned);
- `db`: the tuning database keyed by (model, target, share); `build`: a model built with the
  records of the nearest share; `plan`: pure sharding; `model`, `target`: TVM glue.
"""
