"""Loading a cluster description: a YAML spec, an Alibaba node list CSV, or a shorthand.

`load_cluster(arg)` accepts

- a path to a YAML spec (``.yaml``/``.yml``, or any existing file that is not ``.csv``);
- a path to an Alibaba GPU 2023 node list (``.csv``, header ``sn,cpu_milli,memory_mib,gpu,model``);
- a shorthand such as ``32x8xV100`` or ``16x8xV100,8x8xP100`` (count x GPUs per node x model).

Every error is a one-line `SpecError` that names the file (or the argument) and the field.
"""

from __future__ import annotations

import csv
import os
import re
import typing
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from plinth.core.errors import SpecError
from plinth.core.gpus import gpu_model
from plinth.core.resources import MILLI, Cluster, Node, TenantQuota

# Shorthand nodes get the shape of a typical 8-GPU training server.
SHORTHAND_CPUS = 64
SHORTHAND_MEMORY_MIB = 512 * 1024
SHORTHAND_NODES_PER_RACK = 8
# The Alibaba trace says nothing about topology. Grouping consecutive nodes (the file lists nodes
# of one model together) into racks of 16 gives gangs a plausible locality structure to work with.
ALIBABA_NODES_PER_RACK = 16

_SHORTHAND_PART = re.compile(r"^(\d+)x(\d+)x([A-Za-z0-9][A-Za-z0-9-]*)$", re.IGNORECASE)
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(Mi|Gi|Ti)?\s*$")
_UNIT_MIB = {None: 1, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}


def parse_memory(value: float | str) -> int:
    """MiB from an int (already MiB) or a string such as ``512Gi``, ``2048Mi`` or ``1Ti``."""
    if isinstance(value, bool):  # bool is an int subclass; `memory: true` is a mistake
        raise ValueError(f"expected MiB or a size like 512Gi, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"must be >= 0 (got {value!r})")
        return int(value)
    m = _MEMORY.match(str(value))
    if m is None:
        raise ValueError(f"expected MiB or a size like 512Gi (units Mi, Gi, Ti), got {value!r}")
    return int(round(float(m.group(1)) * _UNIT_MIB[m.group(2)]))


def _canonical_model(name: str | None) -> str | None:
    if name is None or name == "":
        return None
    try:
        return gpu_model(name).name
    except SpecError as e:  # pydantic reports ValueError with the field path attached
        raise ValueError(str(e)) from None


class NodeGroupSpec(BaseModel):
    """`count` identical nodes, named `name-000`, `name-001`, ... (just `name` for one)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    count: int = Field(default=1, ge=1)
    gpus: int = Field(default=0, ge=0)
    gpu_model: str | None = None
    cpus: float = Field(default=SHORTHAND_CPUS, ge=0)
    memory: int = SHORTHAND_MEMORY_MIB
    rack: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("gpu_model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        return _canonical_model(v)

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, v: Any) -> int:
        return parse_memory(v)

    @model_validator(mode="after")
    def _model_needed(self) -> NodeGroupSpec:
        if self.gpus > 0 and self.gpu_model is None:
            raise ValueError(f"gpu_model is required when gpus > 0 (gpus is {self.gpus})")
        return self


class TenantSpec(BaseModel):
    """A Kueue-style ClusterQueue: guaranteed GPUs, a borrowing cap, a cohort to borrow within."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    nominal_gpus: float = Field(ge=0)
    borrowing_limit: float | None = Field(default=None, ge=0)
    cohort: str = "default"
    weight: float = Field(default=1.0, gt=0)


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "cluster"
    nodes_per_rack: int | None = Field(default=None, ge=1)
    nodes: list[NodeGroupSpec] = Field(min_length=1)
    tenants: list[TenantSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_tenants(self) -> ClusterSpec:
        names = [t.name for t in self.tenants]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"tenant name {dup!r} appears twice")
        return self

    def to_cluster(self) -> Cluster:
        nodes: list[Node] = []
        for g in self.nodes:
            for i in range(g.count):
                idx = len(nodes)
                if g.rack is not None:
                    rack = g.rack
                elif self.nodes_per_rack:
                    rack = f"rack-{idx // self.nodes_per_rack}"
                else:
                    rack = "rack-0"  # no topology given: do not invent one
                nodes.append(Node(
                    name=g.name if g.count == 1 else f"{g.name}-{i:03d}",
                    cpus_milli=int(round(g.cpus * MILLI)),
                    memory_mib=g.memory,
                    gpu_model=g.gpu_model if g.gpus else None,
                    num_gpus=g.gpus,
                    rack=rack,
                    labels=tuple(sorted(g.labels.items())),
                ))
        tenants = tuple(TenantQuota(t.name, t.nominal_gpus, t.borrowing_limit, t.cohort, t.weight)
                        for t in self.tenants)
        return Cluster(nodes=tuple(nodes), name=self.name, tenants=tenants)


# --- error formatting -----------------------------------------------------------------------

def _owner(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel]:
    """The model that owns the last field of `loc`, found by walking field annotations."""
    model = root
    for part in loc[:-1]:
        if isinstance(part, int) or part not in model.model_fields:
            continue  # a list index, or a dict key: the item type is found at the next name
        ann = model.model_fields[part].annotation
        for t in (ann, *typing.get_args(ann), *(a for g in typing.get_args(ann)
                                               for a in typing.get_args(g))):
            if isinstance(t, type) and issubclass(t, BaseModel):
                model = t
                break
    return model


def _loc_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _error_text(err: dict[str, Any], root: type[BaseModel]) -> str:
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        owner = _owner(root, tuple(err["loc"]))
        return f"unknown field; allowed fields: {', '.join(owner.model_fields)}"
    if kind == "missing":
        return "required field is missing"
    if kind == "too_short":
        return "must not be empty"
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=",
              "less_than": "<"}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"must be {bounds[kind]} {limit:g} (got {got!r})"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return f"{err['msg'][0].lower()}{err['msg'][1:]} (got {got!r})"


def validation_message(where: str, exc: ValidationError, root: type[BaseModel]) -> str:
    """One line for a pydantic error: where, the field path, and what is wrong with it."""
    return errors_message(where, exc.errors(), root)


def errors_message(where: str, errors: Sequence[dict[str, Any]], root: type[BaseModel]) -> str:
    """`validation_message` for a list of pydantic error dicts (FastAPI hands these over);
    `where` may be empty."""
    # A misspelt field also makes the real one "missing"; the typo is the error to show.
    first = min(errors, key=lambda e: e["type"] != "extra_forbidden")
    path = _loc_path(tuple(first["loc"]))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    head = f"{where}: " if where else ""
    return f"{head}{path + ': ' if path else ''}{_error_text(first, root)}{more}"


def read_yaml(path: str, what: str) -> Any:
    """Parse a YAML file; errors name the file, the line and the problem."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SpecError(f"{path}: cannot read {what}: {e.strerror}") from None
    return parse_yaml(text, path)


def parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark is not None else where
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{at}: invalid YAML: {problem}") from None


# --- loaders ----------------------------------------------------------------------------------


def cluster_from_dict(data: Any, *, source: str = "cluster spec") -> Cluster:
    """Validate an already-parsed spec (e.g. from an API body). `source` prefixes every error."""
    if data is None:
        raise SpecError(f"{source}: is empty; expected a mapping with a 'nodes' list")
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping with a 'nodes' list, "
                        f"got {type(data).__name__}")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(validation_message(source, e, ClusterSpec)) from None
    try:
        return spec.to_cluster()
    except SpecError as e:  # e.g. no GPUs, duplicate node names
        raise SpecError(f"{source}: {e}") from None


def load_cluster_yaml(path: str) -> Cluster:
    data = read_yaml(path, "cluster spec")
    return cluster_from_dict(data, source=path)


def alibaba_node_list(path: str) -> Cluster:
    """A cluster from an Alibaba GPU 2023 node list. Nodes without GPUs are skipped, because the
    trace's CPU-only pods are few and a scheduler study is about the GPU nodes; racks are
    `ALIBABA_NODES_PER_RACK` consecutive nodes (the trace has no topology)."""
    need = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
    nodes: list[Node] = []
    try:
        f = open(path, newline="", encoding="utf-8-sig")
    except OSError as e:
        raise SpecError(f"{path}: cannot read node list: {e.strerror}") from None
    with f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in need if c not in header]
        if missing:
            raise SpecError(f"{path}:1: missing column {missing[0]!r} (need {','.join(need)})")
        col = {c: header.index(c) for c in need}
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            if len(row) < len(header):
                raise SpecError(f"{path}:{line}: expected {len(header)} fields, got {len(row)}")
            values = {}
            for c in ("cpu_milli", "memory_mib", "gpu"):
                text = row[col[c]].strip()
                try:
                    values[c] = int(float(text))
                except ValueError:
                    raise SpecError(f"{path}:{line}: {c}: expected an integer, "
                                    f"got {text!r}") from None
                if values[c] < 0:
                    raise SpecError(f"{path}:{line}: {c}: must be >= 0, got {text!r}")
            if values["gpu"] == 0:
                continue
            try:
                model = gpu_model(row[col["model"]].strip()).name
            except SpecError as e:
                raise SpecError(f"{path}:{line}: model: {e}") from None
            nodes.append(Node(
                name=row[col["sn"]].strip(), cpus_milli=values["cpu_milli"],
                memory_mib=values["memory_mib"], gpu_model=model, num_gpus=values["gpu"],
                rack=f"rack-{len(nodes) // ALIBABA_NODES_PER_RACK}",
            ))
    name = os.path.splitext(os.path.basename(path))[0]
    if not nodes:
        raise SpecError(f"{path}: has no GPU nodes")
    try:
        return Cluster(nodes=tuple(nodes), name=name)
    except SpecError as e:
        raise SpecError(f"{path}: {e}") from None


def parse_shorthand(arg: str) -> Cluster:
    """`16x8xV100,8x8xP100`: node groups of count x GPUs per node x model, in racks of 8."""
    nodes: list[Node] = []
    seen: dict[str, int] = {}  # per-model counter, so two V100 groups do not reuse names
    for part in arg.split(","):
        m = _SHORTHAND_PART.match(part.strip())
        if m is None:
            raise SpecError(f"cluster {arg!r}: cannot read {part.strip()!r}; expected "
                            f"COUNTxGPUSxMODEL such as 32x8xV100 (or a .yaml/.csv file)")
        count, gpus = int(m.group(1)), int(m.group(2))
        try:
            model = gpu_model(m.group(3)).name
        except SpecError as e:
            raise SpecError(f"cluster {arg!r}: {e}") from None
        if count < 1 or gpus < 1:
            raise SpecError(f"cluster {arg!r}: {part.strip()!r}: count and GPUs must be >= 1")
        for _ in range(count):
            i = seen.get(model, 0)
            seen[model] = i + 1
            nodes.append(Node(
                name=f"{model.lower()}-{i:03d}", cpus_milli=SHORTHAND_CPUS * MILLI,
                memory_mib=SHORTHAND_MEMORY_MIB, gpu_model=model, num_gpus=gpus,
                rack=f"rack-{len(nodes) // SHORTHAND_NODES_PER_RACK}",
            ))
    return Cluster(nodes=tuple(nodes), name=arg)


def load_cluster(arg: str) -> Cluster:
    """A cluster from a YAML spec path, an Alibaba node list CSV path, or a shorthand."""
    arg = str(arg)
    ext = os.path.splitext(arg)[1].lower()
    if os.path.isfile(arg):
        return alibaba_node_list(arg) if ext == ".csv" else load_cluster_yaml(arg)
    if ext in (".yaml", ".yml", ".csv") or os.sep in arg:
        raise SpecError(f"{arg}: no such file")
    if not arg.strip():
        raise SpecError("cluster '': expected a .yaml spec, a node list .csv or a shorthand "
                        "such as 32x8xV100")
    return parse_shorthand(arg)


def dump_cluster_yaml(cluster: Cluster) -> str:
    """A YAML spec that `load_cluster` reads back to an equal cluster (one entry per node)."""
    data: dict[str, Any] = {"name": cluster.name, "nodes": []}
    for n in cluster.nodes:
        entry: dict[str, Any] = {"name": n.name, "gpus": n.num_gpus}
        if n.gpu_model:
            entry["gpu_model"] = n.gpu_model
        entry.update(cpus=n.cpus_milli / MILLI, memory=n.memory_mib, rack=n.rack)
        if n.labels:
            entry["labels"] = dict(n.labels)
        data["nodes"].append(entry)
    if cluster.tenants:
        data["tenants"] = [
            {"name": t.name, "nominal_gpus": t.nominal_gpus, "borrowing_limit": t.borrowing_limit,
             "cohort": t.cohort, "weight": t.weight} for t in cluster.tenants
        ]
    return yaml.safe_dump(data, sort_keys=False)
