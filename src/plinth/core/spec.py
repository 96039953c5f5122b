"""User-written specs: the one loader for every kind, its one-line errors, and clusters.

`load_spec(path_or_text)` reads a YAML spec once and checks it with the pydantic model of its
top-level `kind` (`Job` when absent, `Service`, `FLTask`, `Cluster`; see `KINDS`):

    spec = load_spec("train.yaml")                # any kind: JobSpec, ServiceSpec, AppSpec, ...
    spec = load_spec("service.yaml", kind="Service")  # that kind only; `kind:` may be left out

Every error is a one-line `SpecError`: the file, the line when known, the field path and the
value, e.g. ``train.yaml:7: resources.gpus: must be >= 0 (got -1)``. A file that would cost far
more to read than its size (aliases that repeat more than 100,000 values, a "billion laughs";
values nested deeper than 64) is refused the same way, at the line at fault.

Every kind's model has `submitted(base) -> spec`: the spec as `plinth submit` sends it. Its
paths are made absolute (a file named beside the spec against `base`, the spec's folder; a
working directory against where you submit), and what the control plane must not do itself is
done there (a Service's model is loaded and timed once, in a child process).

`load_cluster(arg)` accepts

- a path to a YAML spec (``.yaml``/``.yml``, or any existing file that is not ``.csv``);
- a path to an Alibaba GPU 2023 node list (``.csv``, header ``sn,cpu_milli,memory_mib,gpu,model``);
- a shorthand such as ``32x8xV100`` or ``16x8xV100,8x8xP100`` (count x GPUs per node x model).
"""

from __future__ import annotations

import csv
import functools
import math
import os
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from plinth.core.errors import SpecError
from plinth.core.gpus import gpu_model
from plinth.core.registry import Registry
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


def from_folder(folder: Path | None, path: str) -> str:
    """`path` made absolute, a relative one taken from `folder` (a spec's folder; without one,
    the current directory): a spec's folders (a workdir, a database) are found from the spec."""
    return os.path.abspath(path if folder is None else os.path.join(folder, path))


def beside(folder: Path | None, arg: str) -> str:
    """`arg` as an absolute path if it names a file in `folder` (a spec's folder), else as it
    is: `train.py` beside `train.yaml` runs from any directory."""
    if folder is None or not arg or arg.startswith("-") or os.path.isabs(arg) or "\n" in arg:
        return arg
    path = folder / arg
    return str(path.resolve()) if path.is_file() else arg


def parse_memory(value: float | str) -> int:
    """MiB from an int (already MiB) or a string such as ``512Gi``, ``2048Mi`` or ``1Ti``."""
    if isinstance(value, bool):  # bool is an int subclass; `memory: true` is a mistake
        raise ValueError(f"expected MiB or a size like 512Gi, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"must be >= 0 (got {value!r})")
        if not math.isfinite(value):  # int(inf) is an OverflowError, which pydantic passes on
            raise ValueError(f"must be a finite number (got {value!r})")
        return int(value)
    m = _MEMORY.match(str(value))
    if m is None:
        raise ValueError(f"expected MiB or a size like 512Gi (units Mi, Gi, Ti), got {value!r}")
    mib = float(m.group(1)) * _UNIT_MIB[m.group(2)]
    if not math.isfinite(mib):  # 400 digits
        raise ValueError(f"must be a finite number (got {value!r})")
    return int(round(mib))


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
    run_with: ClassVar[str] = "plinth sim --cluster FILE"

    kind: Literal["Cluster"] = "Cluster"
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
        limit, unit = next(iter(ctx.values())), _unit(root, tuple(err["loc"]))
        return f"must be {bounds[kind]} {_plain(limit)}{unit} (got {_plain(got)}{unit})"
    if kind == "finite_number":
        return f"must be a finite number (got {got!r})"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return f"{err['msg'][0].lower()}{err['msg'][1:]} (got {got!r})"


def _plain(x: Any) -> str:
    """A number as a person writes it: 2147483647, 0.25; never 2.14748e+09."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e18:
        return str(int(x))
    return repr(x) if isinstance(x, str) else str(x)


def _unit(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """" MiB", " s": the unit a field declares (json_schema_extra={"unit": ...}), if any."""
    if not loc or not isinstance(loc[-1], str):
        return ""
    info = _owner(root, loc).model_fields.get(loc[-1])
    extra = info.json_schema_extra if info is not None else None
    return f" {extra['unit']}" if isinstance(extra, dict) and "unit" in extra else ""


def validation_message(where: str, exc: ValidationError, root: type[BaseModel]) -> str:
    """One line for a pydantic error: where, the field path, and what is wrong with it."""
    return errors_message(where, exc.errors(), root)


def errors_message(where: str, errors: Sequence[dict[str, Any]], root: type[BaseModel], *,
                   line_of: Callable[[tuple[Any, ...]], int | None] | None = None) -> str:
    """`validation_message` for a list of pydantic error dicts (FastAPI hands these over);
    `where` may be empty. `line_of` maps a field path to its line in the file, when known."""
    # A misspelt field also makes the real one "missing"; the typo is the error to show.
    first = min(errors, key=lambda e: e["type"] != "extra_forbidden")
    loc = tuple(first["loc"])
    path = _loc_path(loc)
    line = line_of(loc) if line_of is not None and where else None
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    head = f"{where}:{line}: " if line else f"{where}: " if where else ""
    return f"{head}{path + ': ' if path else ''}{_error_text(first, root)}{more}"


# --- reading YAML -----------------------------------------------------------------------------


def read_text(path: str | Path, what: str) -> str:
    """A UTF-8 file's text; an error names the file and `what` it should have held."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"{path}: cannot read {what}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: cannot read {what}: not UTF-8 text") from None


# A small file must not cost much to read. Aliases (`*name`) may repeat at most this many
# values in all (a "billion laughs" file of a few hundred bytes repeats 10^9), and values nest at
# most this deep (PyYAML composes recursively: deeper would be a RecursionError, not one line).
MAX_ALIAS_VALUES = 100_000
MAX_YAML_DEPTH = 64


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases that expand past MAX_ALIAS_VALUES values, aliases
    to a value that contains them, and nesting deeper than MAX_YAML_DEPTH, at the line of the
    alias or value at fault."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0
        self._size: dict[int, int] = {}  # id(node) -> the values it holds, aliases expanded
        self._repeated = 0  # values that aliases have repeated so far

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):  # the anchored node, composed before
            node = super().compose_node(parent, index)
            size = self._size.get(id(node))
            if size is None:
                raise yaml.composer.ComposerError(
                    None, None, "an alias inside the value it names (recursive)", mark)
            self._repeated += size
            if self._repeated > MAX_ALIAS_VALUES:
                raise yaml.composer.ComposerError(
                    None, None, f"aliases repeat more than {MAX_ALIAS_VALUES} values", mark)
            return node
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"values nest deeper than {MAX_YAML_DEPTH} levels", mark)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        kids = node.value if isinstance(node, yaml.SequenceNode) else \
            [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else ()
        self._size[id(node)] = 1 + sum(self._size[id(k)] for k in kids)
        return node


def parse_yaml_nodes(text: str, where: str) -> tuple[Any, yaml.Node | None]:
    """The document and its node tree (which knows every value's line), from one parse; a
    syntax error, or a file that would cost far more to read than its size (see _SpecLoader),
    names the file and the line."""
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        return (None if node is None else loader.construct_document(node)), node
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark is not None else where
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        context = getattr(e, "context", None)  # "while parsing ..." says nothing new
        if context and not context.startswith("while "):
            problem = f"{context}, {problem}"
        raise SpecError(f"{at}: invalid YAML: {problem}") from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path, what: str) -> Any:
    """Parse a YAML file; errors name the file, the line and the problem."""
    return parse_yaml_nodes(read_text(path, what), str(path))[0]


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The line of the deepest value along the field path `loc` (None: not in the file)."""
    line = None
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value
                          if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) \
                and 0 <= part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node, line = child, child.start_mark.line + 1
    return line


# --- one loader for every kind of spec --------------------------------------------------------

# A spec names its kind in a top-level `kind` field. Each kind's model has a field
# `kind: Literal["<kind>"]` and a `run_with` ClassVar: the command that runs a spec of that kind.
KINDS: Registry[type[BaseModel]] = Registry("kind")
# The control plane registers the kinds from the top (`plinth.control.kinds`).
DEFAULT_KIND = "Job"


# The validation context of a spec the platform made itself, or read back from its store: such a
# spec skips the floors only a tenant's spec must meet (see plinth.core.jobspec.Resources).
TRUSTED: dict[str, bool] = {"trusted": True}


def trusted(context: Any) -> bool:
    """Whether a validator's `info.context` is TRUSTED."""
    return isinstance(context, dict) and context.get("trusted") is True


KindArg = str | type[BaseModel] | None  # a kind's name, or its model (then nothing is looked up)


def load_spec(path_or_text: str | Path, *, kind: KindArg = None, source: str | None = None,
              overrides: Mapping[str, Any] | None = None) -> Any:
    """Read a spec once and check it with its kind's model; returns the model.

    `path_or_text` is a file (a `Path`, or a string without a newline) or YAML text (a string
    with one; `source` then names it in errors, default "spec"). With `kind`, the file must be
    of that kind and may leave `kind` out (`plinth serve up`, `plinth fl sim`); without, any
    kind, and `Job` when the file names none (`plinth submit`). `overrides` maps dotted field
    paths to values that replace the file's (from the command line). Every error is one line:
    the file, the line when known, the field path and the value.
    """
    if isinstance(path_or_text, Path) or "\n" not in path_or_text:
        where = str(path_or_text)
        text = read_text(where, f"a {kind} spec" if kind else "a spec")
    else:
        where, text = source or "spec", path_or_text
    data, node = parse_yaml_nodes(text, where)
    return _check(data, where, kind, overrides, node)


def spec_from_dict(data: Any, *, source: str = "spec", kind: KindArg = None,
                   overrides: Mapping[str, Any] | None = None, stored: bool = False) -> Any:
    """`load_spec` for an already-parsed document (an API body, a test); `source` prefixes
    every error and may be empty. `stored`: a spec the store holds, accepted when it was
    submitted, is read with the context TRUSTED (floors added since do not lose it)."""
    return _check(data, source, kind, overrides, None, TRUSTED if stored else None)


def _check(data: Any, where: str, kind: KindArg, overrides: Mapping[str, Any] | None,
           node: yaml.Node | None, context: dict | None = None) -> Any:
    head = f"{where}: " if where else ""
    if not isinstance(data, dict):
        got = "an empty document" if data is None else f"a {type(data).__name__}"
        raise SpecError(f"{head}expected a mapping of spec fields, got {got}")
    named = data.get("kind")
    line = _line_of(node, ("kind",)) if named is not None else None
    field = f"{where}:{line}: kind" if line else f"{head}kind"
    given = kind if isinstance(kind, type) else None
    if given is not None:
        kind = given.model_fields["kind"].default
    if given is not None and (named is None or str(named).strip().lower() == kind.lower()):
        name, model = kind, given
    else:
        name = KINDS.check(kind or DEFAULT_KIND) if named is None else KINDS.check(str(named),
                                                                                  field=field)
        model = KINDS.get(name)
    if kind is not None and name != (kind if given is not None else KINDS.check(kind)):
        raise SpecError(f"{field}: this command reads a {kind if given else KINDS.check(kind)} "
                        f"spec, not a {name} spec (run that with "
                        f"`{model.run_with}`)")  # type: ignore[attr-defined]
    data = _override({**data, "kind": name}, overrides or {}, where)
    try:
        return model.model_validate(data, context=context)
    except ValidationError as e:
        raise SpecError(errors_message(where, e.errors(), model,
                                       line_of=functools.partial(_line_of, node))) from None


def _override(data: dict[str, Any], overrides: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`data` with each dotted field of `overrides` set (None: left as it is); `data` itself is
    not changed."""
    for key, value in overrides.items():
        if value is None:
            continue
        *parents, leaf = key.split(".")
        data = node = {**data}
        for i, k in enumerate(parents):
            child = node.get(k, {})
            if not isinstance(child, dict):
                raise SpecError(f"{where}: {'.'.join(parents[:i + 1])}: expected a mapping "
                                f"to set {key} in, got {child!r}")
            node[k] = child = {**child}
            node = child
        node[leaf] = value
    return data


# --- cluster loaders --------------------------------------------------------------------------


def cluster_from_dict(data: Any, *, source: str = "cluster spec") -> Cluster:
    """Validate an already-parsed spec (e.g. from an API body). `source` prefixes every error."""
    return _to_cluster(spec_from_dict(data, source=source, kind=ClusterSpec), source)


def load_cluster_yaml(path: str) -> Cluster:
    return _to_cluster(load_spec(Path(path), kind=ClusterSpec), path)


def _to_cluster(spec: ClusterSpec, source: str) -> Cluster:
    try:
        return spec.to_cluster()
    except SpecError as e:  # e.g. no GPUs, duplicate node names
        raise SpecError(f"{source}: {e}") from None


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
    data: dict[str, Any] = {"kind": "Cluster", "name": cluster.name, "nodes": []}
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
