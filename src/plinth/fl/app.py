"""The FL app spec: one YAML file that `plinth fl server|client|sim` all read.

Checked once, at the boundary, by pydantic models that refuse unknown keys, through the one spec
loader (`plinth.core.spec.load_spec`, kind `FLTask`; the file may leave `kind` out). Errors are
one line naming the file, the line and the field, e.g.
``app.yaml:7: server.fraction: must be <= 1 (got 1.5)``.

The YAML names a Python file (`code`, relative to the YAML) that defines ``make_model(spec)``
returning a `torch.nn.Module`; it may also define ``make_client(cid, train, test, spec)`` to
replace the built-in PyTorch classifier client.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from plinth.core.jobspec import Resources
from plinth.core.errors import PlinthError, SpecError
from plinth.core.spec import load_spec, spec_from_dict
from plinth.fl.compress import CODECS
from plinth.fl.robust.rules import RULES
from plinth.fl.strategies import STRATEGIES


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DataSpec(_Spec):
    source: Literal["mnist", "digits", "idx", "csv", "leaf"] = "digits"
    path: str | None = None  # mnist: .pkl.gz or .whl; csv/leaf: file or folder; idx: images file
    labels: str | None = None  # idx: labels file
    label_column: str = "label"
    fallback: Literal["digits", "none"] = "digits"  # when MNIST is not installed
    partition: Literal["iid", "dirichlet", "shards", "natural"] = "iid"
    alpha: float = Field(default=0.5, gt=0)
    shards_per_client: int = Field(default=2, ge=1)
    clients: int = Field(default=10, ge=1)
    test_fraction: float = Field(default=0.2, gt=0, lt=1)  # for sources without a test split
    max_train: int | None = Field(default=None, ge=1)  # cap examples (tests, quick runs)
    max_test: int | None = Field(default=None, ge=1)


class TrainSpec(_Spec):
    epochs: int = Field(default=1, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=0.05, gt=0)
    momentum: float = Field(default=0.0, ge=0, lt=1)




class RobustSpec(_Spec):
    """A Byzantine-robust rule in place of the weighted mean of the round's updates.

    The rule needs every update of the round at once, so the server keeps them all: memory grows
    from one model (the streaming FedAvg engine) to n_clients models.
    """

    rule: str  # a name in plinth.fl.robust.rules.RULES
    f: int = Field(default=1, ge=0)  # attackers tolerated per round (krum, bulyan)
    m: int | None = Field(default=None, ge=1)  # multi_krum: updates kept (default n - f)
    trim: int | None = Field(default=None, ge=0)  # trimmed_mean: cut per side (default f)
    tau: float = Field(default=1.0, gt=0)  # centered_clipping: clip radius
    iterations: int = Field(default=3, ge=1)  # centered_clipping
    root_examples: int = Field(default=100, ge=1)  # fltrust: the server's clean root set

    @field_validator("rule")
    @classmethod
    def _known(cls, v: str) -> str:
        return RULES.check(v)


class StrategySpec(_Spec):
    name: str = "fedavg"
    options: dict[str, Any] = Field(default_factory=dict)
    robust: RobustSpec | None = None

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        return STRATEGIES.check(v)


class EligibilitySpec(_Spec):
    min_examples: int = Field(default=1, ge=0)
    require: dict[str, bool | int | float | str] = Field(default_factory=dict)


class AggregationSpec(_Spec):
    """How the server folds updates: `stream` in its own process, or `tree`: the elastic LIFL
    tree of leaf aggregator processes over shared memory (plinth.fl.aggregate.tree). With
    `leaves: auto` each round is sized by `plinth.fl.aggregate.sizing.size_tree`: enough leaves
    to fold the selected updates within `fold_deadline` seconds at the leaves' measured
    throughput (`updates_per_leaf` a leaf before any was measured), and at least enough that no
    leaf is planned more than `max_updates_per_leaf` updates (when set: it bounds what one dead
    leaf takes with it), at most `max_leaves` (the task's aggregator budget, not the machine's
    CPU count); or a fixed number."""

    mode: Literal["stream", "tree"] = "stream"
    leaves: Any = "auto"  # "auto" or a whole number >= 1
    max_leaves: int = Field(default=4, ge=1)
    updates_per_leaf: int = Field(default=8, ge=1)
    max_updates_per_leaf: int | None = Field(default=None, ge=1)
    fold_deadline: float = Field(default=1.0, gt=0)
    # a leaf that hands back no slot (or no partial sum) for this long is stuck: it is killed
    # and replaced, and the round's updates it held are failures
    leaf_timeout: float = Field(default=60.0, gt=0)
    # leaves started by the runtime join here (loopback host:port or a UNIX socket path) with
    # the token in leaf_token_file; the server then starts no leaf process itself
    leaf_listen: str | None = None
    leaf_token_file: str | None = None
    leaf_join_timeout: float = Field(default=60.0, gt=0)
    # In an FLTask: this many middle aggregators, each on its own node with its own leaves (a
    # tree of the settings above): client `cid` joins middle `cid mod middles` (addresses in
    # `plinth show TASK`), and the server folds one update per middle. 0: clients join the
    # server, whose node holds the leaves.
    middles: int = Field(default=0, ge=0)

    @field_validator("leaf_listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        from plinth.fl.aggregate.leaf import parse_address

        try:
            parse_address(v) if v is not None else None
        except (PlinthError, ValueError) as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("leaves")
    @classmethod
    def _leaves(cls, v: Any) -> Any:
        if v != "auto" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"must be 'auto' or a whole number >= 1 (got {v!r})")
        return v

    @model_validator(mode="after")
    def _cap(self) -> AggregationSpec:
        if (self.leaf_listen is None) != (self.leaf_token_file is None):
            raise ValueError("leaf_listen and leaf_token_file go together (external leaves "
                             "join with the task's token)")
        if self.middles and self.mode != "tree":
            raise ValueError("middles: middle aggregators are part of the tree "
                             "(server.aggregation.mode: tree)")
        if self.leaves != "auto" and "max_leaves" not in self.model_fields_set:
            self.max_leaves = max(self.max_leaves, self.leaves)  # a fixed tree sets its own cap
        if self.leaves != "auto" and self.leaves > self.max_leaves:
            raise ValueError(f"leaves: {self.leaves} is more than max_leaves {self.max_leaves}")
        return self


class ServerSpec(_Spec):
    rounds: int = Field(default=10, ge=1)
    fraction: float = Field(default=0.1, gt=0, le=1)
    min_clients: int = Field(default=2, ge=1)
    min_available: int = Field(default=2, ge=1)
    straggler_timeout: float = Field(default=300.0, gt=0)  # seconds per round (per task if async)
    wait_timeout: float = Field(default=600.0, gt=0)  # for min_available clients to join
    eligibility: EligibilitySpec = Field(default_factory=EligibilitySpec)
    concurrency: int = Field(default=10, ge=1)  # async: client tasks in flight
    aggregation_threads: int = Field(default=1, ge=1)
    aggregation: AggregationSpec = Field(default_factory=AggregationSpec)
    evaluate_every: int = Field(default=1, ge=1)
    # central: the server scores the model on the app's test split; federated: the round's
    # clients score it on their own data (for servers that hold no data)
    evaluate: Literal["central", "federated"] = "central"


class CompressionSpec(_Spec):
    kind: str = "none"
    ratio: float = Field(default=0.01, gt=0, le=1)
    error_feedback: bool = True

    @field_validator("kind")
    @classmethod
    def _known(cls, v: str) -> str:
        return CODECS.check(v)


class AttackSpec(_Spec):
    """Simulated attackers: `fraction` of the clients (chosen from the app's seed) misbehave."""

    kind: Literal["sign_flip", "scale", "gaussian", "label_flip", "backdoor"]
    fraction: float = Field(default=0.2, ge=0, lt=1)
    scale: float | None = Field(default=None, gt=0)  # sign_flip: -scale·Δ (1); scale: boost (10)
    std: float = Field(default=1.0, gt=0)  # gaussian: the noise sent instead of the update
    target: int = Field(default=0, ge=0)  # backdoor: the label the trigger maps to
    poison_fraction: float = Field(default=0.5, gt=0, le=1)  # backdoor: share of poisoned data
    patch: int = Field(default=3, ge=1)  # backdoor: trigger square side, in pixels


class AdaptiveClipSpec(_Spec):
    target_quantile: float = Field(default=0.5, gt=0, lt=1)
    learning_rate: float = Field(default=0.2, gt=0)
    count_noise_std: float | None = Field(default=None, gt=0)  # default: the noise multiplier


# Where DP noise comes from. numpy: seeded from the app's seed, reproducible, and so known to
# everyone who holds the YAML: for `plinth fl sim` only (`plinth fl server|client` refuse it).
# chacha: a CSPRNG keyed by the OS. auto: numpy in `plinth fl sim`, chacha everywhere else.
Noise = Literal["auto", "numpy", "chacha"]


def seeded_noise(noise: str, *, simulated: bool) -> bool:
    """Whether `noise` (a DP spec's `noise:`) means the seeded generator on this path."""
    return noise == "numpy" or (noise == "auto" and simulated)


class DPSpec(_Spec):
    """Client-level DP-FedAvg: clip each update, Gaussian noise on the sum.

    mode central: the server adds N(0, (z·C)²) to the sum (it sees the clean updates).
    mode distributed (needs `privacy.secagg`): each client adds its share N(0, (z·C)²/m) before
    SecAgg masking, so the sum the server unmasks carries the full noise; see
    plinth.fl.privacy.dp.distributed_noise_share for what that guarantees. m is
    `min_honest_clients` (default: the round's selected clients).
    """

    mode: Literal["central", "distributed"] = "central"
    min_honest_clients: int | None = Field(default=None, ge=1)  # distributed: m
    clip: float = Field(default=1.0, gt=0)  # L2 norm each client's update is clipped to
    noise_multiplier: float = Field(gt=0)
    adaptive: AdaptiveClipSpec | None = None
    delta: float = Field(default=1e-5, gt=0, lt=1)
    epsilon_budget: float | None = Field(default=None, gt=0)
    accountant: Literal["rdp", "pld"] = "rdp"
    noise: Noise = "auto"

    @model_validator(mode="after")
    def _count_noise(self) -> DPSpec:
        a = self.adaptive
        if a is not None and a.count_noise_std is not None \
                and a.count_noise_std <= self.noise_multiplier / 2:
            raise ValueError(f"adaptive.count_noise_std must be > noise_multiplier / 2 = "
                             f"{self.noise_multiplier / 2:g} (got {a.count_noise_std:g})")
        return self


class LocalDPSpec(_Spec):
    """Local DP: each client clips its update to L2 norm `clip` and adds N(0, (z·C)²) before upload.

    The guarantee holds against the server itself (and anyone who sees the uploads): each upload
    is a Gaussian mechanism with multiplier z on that client's update, and a client that takes
    part in every round composes one such mechanism a round (no subsampling amplification: the
    server knows who uploaded). The sim reports that ε(δ) per round as `local_epsilon`.
    """

    clip: float = Field(default=1.0, gt=0)  # L2 norm each client clips its update to
    noise_multiplier: float = Field(gt=0)  # z: noise std is z·clip on every coordinate
    delta: float = Field(default=1e-5, gt=0, lt=1)
    epsilon_budget: float | None = Field(default=None, gt=0)  # stop before local ε exceeds it
    accountant: Literal["rdp", "pld"] = "rdp"
    noise: Noise = "auto"


class SecAggSpec(_Spec):
    """SecAgg+ for the round's sum: the server drives the protocol's four stages over the
    transport (`plinth fl sim` and `plinth fl server`) and sees only masked updates and their
    sum; see plinth.fl.privacy.secagg_round."""

    neighbours: int | None = Field(default=None, ge=2)  # None: about 2·log2(n); full_graph: all
    # Shamir threshold as a fraction of the neighbours; clients refuse t <= k/2 (a server could
    # then rebuild both a client's masks), so at least 0.5
    threshold: float = Field(default=0.5, ge=0.5, lt=1)
    full_graph: bool = False
    clip: float = Field(default=1.0, gt=0)  # each coordinate is clipped to ±clip ...
    scale: float = Field(default=float(1 << 16), gt=0)  # ... and rounded to 1/scale


class PrivacySpec(_Spec):
    dp: DPSpec | None = None
    local_dp: LocalDPSpec | None = None
    secagg: SecAggSpec | None = None


class ConsentSpec(_Spec):
    purpose: str = Field(min_length=1)
    registry: str  # SQLite file of plinth.fl.privacy.consent.ConsentRegistry
    min_version: int = Field(default=1, ge=1)
    task_id: str | None = None  # in the audit log; default: the app's name


class TlsSpec(_Spec):
    cert: str | None = None  # server: its certificate chain (PEM)
    key: str | None = None  # server: its private key (PEM)
    ca: str | None = None  # client: the CA that signed the server's certificate


class TransportSpec(_Spec):
    chunk_size: int = Field(default=1 << 20, ge=1024)
    tls: TlsSpec | None = None
    tokens: str | None = None  # file of "client_id token" lines; none = no authentication
    token: str | None = None  # client side: its token (or PLINTH_FL_TOKEN)
    client_id: str | None = None  # client side
    # client side: seconds to wait for the server to answer a join, at the start and after a
    # lost connection (a queued task's server may not be placed yet, or be restarting)
    connect_timeout: float = Field(default=300.0, gt=0)


class AdmmSpec(_Spec):
    """Decentralised training (`plinth fl admm`): no server; each round every site trains on its
    partition, then the sites average their models by consensus ADMM over a Kirkman schedule."""

    sites: int = Field(default=9, ge=3)  # v = 3 (mod 6): 9, 15, 21, ...
    rounds: int = Field(default=10, ge=1)
    local_epochs: int | None = Field(default=None, ge=1)  # default: train.epochs
    rho: float = Field(default=0.5, gt=0)  # ADMM penalty of the first iteration ...
    rho_decay: float = Field(default=0.5, gt=0, le=1)  # ... times rho_decay each iteration
    lambda_std: float = Field(default=1.0, gt=0)  # std of the random initial duals
    iterations: int | None = Field(default=None, ge=1)  # per round; default the cap
    timeout: float = Field(default=120.0, gt=0)  # seconds a site waits for a peer's message

    @field_validator("sites")
    @classmethod
    def _kirkman(cls, v: int) -> int:
        if v % 6 != 3:
            raise ValueError(f"a Kirkman schedule needs sites = 3 (mod 6): 9, 15, 21, ... "
                             f"(got {v})")
        return v

    @model_validator(mode="after")
    def _cap(self) -> AdmmSpec:
        cap = 2 * ((self.sites - 1) // 2) - 1
        if self.iterations is not None and self.iterations > cap:
            raise ValueError(f"iterations: at most 2·(sites−1)/2 − 1 = {cap} with "
                             f"{self.sites} sites (got {self.iterations})")
        return self


class AppSpec(_Spec):
    """Read it with `load_app` (or `plinth.core.spec.load_spec(path, kind=AppSpec)`)."""

    run_with: ClassVar[str] = "plinth fl sim|server|client FILE"

    kind: Literal["FLTask"] = "FLTask"
    name: str = "fl-app"
    # As a platform workload (`plinth submit`): whose it is, and what its server runs with.
    tenant: str | None = None
    priority: int = Field(default=0, ge=-1000, le=1000)
    resources: Resources = Field(default_factory=lambda: Resources(cpus=1, memory=2048))
    code: str | None = None
    seed: int = 0
    data: DataSpec = Field(default_factory=DataSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    strategy: StrategySpec = Field(default_factory=StrategySpec)
    server: ServerSpec = Field(default_factory=ServerSpec)
    compression: CompressionSpec = Field(default_factory=CompressionSpec)
    transport: TransportSpec = Field(default_factory=TransportSpec)
    attack: AttackSpec | None = None
    privacy: PrivacySpec = Field(default_factory=PrivacySpec)
    consent: ConsentSpec | None = None
    admm: AdmmSpec | None = None  # `plinth fl admm`: decentralised, no server
    checkpoint_dir: str | None = None
    base_dir: str = "."  # set by `load_app` to the YAML's folder

    def submitted(self, base: Path | None) -> AppSpec:
        """The app's files (code, data, tokens) are found beside its YAML."""
        return self.model_copy(update={"base_dir": str(Path(base or ".").resolve())})

    @model_validator(mode="after")
    def _works_together(self) -> AppSpec:
        # Build the strategy once so that its options are checked at start-up too.
        from plinth.fl.strategies import make_strategy

        try:
            make_strategy(self.strategy.name, self.strategy.options)
        except SpecError as e:
            raise ValueError(str(e)) from None
        problem = _combination_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    def resolve(self, p: str | None) -> str | None:
        """A path from the YAML, taken relative to the YAML's folder."""
        if p is None:
            return None
        q = Path(p).expanduser()
        return str(q if q.is_absolute() else Path(self.base_dir) / q)


def parse_app(doc: Any, where: str = "app", base_dir: str = ".") -> AppSpec:
    """An app spec from an already-parsed document; paths in it are taken relative to
    `base_dir`."""
    return spec_from_dict(doc, source=where, kind=AppSpec, overrides={"base_dir": base_dir})


# what the aggregator tree cannot take, and why, in one line each
_TREE_REFUSES = (
    ("strategy.robust", lambda s: s.strategy.robust,
     "a robust rule needs every update of the round at once; the leaves keep only sums"),
    ("privacy.dp", lambda s: s.privacy.dp,
     "central DP clips and counts each update in the server before noising the sum"),
    ("privacy.secagg", lambda s: s.privacy.secagg,
     "SecAgg+ sums masked vectors in a finite field through its own four stages"),
)


def tree_problem(spec: AppSpec) -> str | None:
    """Why an app cannot use `server.aggregation.mode: tree` (plinth.fl.aggregate.tree), as
    'field: why'; None if it can. Consent and local DP act outside the fold (selection,
    arrival, accounting), so they can."""
    if spec.server.aggregation.mode != "tree":
        return None
    if STRATEGIES.get(spec.strategy.name).asynchronous:
        return (f"server.aggregation.mode: tree folds whole rounds; {spec.strategy.name!r} is "
                f"asynchronous (steps the model per buffered update); use mode: stream")
    if spec.server.aggregation.middles and spec.consent is not None:
        return ("server.aggregation.middles: consent is checked where a client joins the "
                "server, and a middle aggregator's clients join it instead; use middles: 0")
    for name, on, why in _TREE_REFUSES:
        if on(spec) is not None:
            return f"server.aggregation.mode: tree cannot be combined with {name}: {why}; " \
                   f"use mode: stream"
    return None


def _combination_problem(spec: AppSpec) -> str | None:
    """Settings that are each valid but do not work together, as 'field: why'."""
    if (tree := tree_problem(spec)) is not None:
        return tree
    asynchronous = STRATEGIES.get(spec.strategy.name).asynchronous
    dp, secagg = spec.privacy.dp, spec.privacy.secagg
    for field_name, on in (("strategy.robust", spec.strategy.robust), ("privacy.dp", dp),
                           ("privacy.local_dp", spec.privacy.local_dp),
                           ("privacy.secagg", secagg), ("consent", spec.consent)):
        if on is not None and asynchronous:
            return (f"{field_name}: needs a synchronous strategy (rounds), not "
                    f"{spec.strategy.name!r}")
    if spec.strategy.robust is not None and (dp is not None or secagg is not None):
        what = "privacy.dp" if dp is not None else "privacy.secagg"
        return (f"strategy.robust: cannot be combined with {what} (a robust rule must see each "
                f"update; DP and SecAgg release only a noisy or masked sum)")
    if secagg is not None and spec.compression.kind != "none":
        return (f"privacy.secagg: cannot be combined with compression.kind "
                f"{spec.compression.kind!r} (SecAgg+ masks each client's dense fixed-point "
                f"update; the masked vector cannot be compressed)")
    if secagg is not None and dp is not None and dp.mode != "distributed":
        return ("privacy.secagg: combines with privacy.dp only in privacy.dp.mode: distributed "
                "(each client adds its noise share before masking)")
    if dp is not None and dp.mode == "distributed":
        if secagg is None:
            return ("privacy.dp.mode: distributed needs privacy.secagg (without it the server "
                    "sees each client's partly noised update)")
        if dp.adaptive is not None:
            return "privacy.dp.adaptive: not supported with privacy.dp.mode: distributed"
    return None


def load_app(path: str | Path, overrides: dict[str, Any] | None = None) -> AppSpec:
    """Read and check an app YAML. `overrides` maps dotted fields to values (from the CLI)."""
    p = Path(path)
    return load_spec(p, kind=AppSpec,
                     overrides={**(overrides or {}), "base_dir": str(p.resolve().parent)})


def load_code(spec: AppSpec) -> ModuleType:
    """Import the app's Python file (under a name unique to its path)."""
    path = spec.resolve(spec.code)
    if path is None:
        raise SpecError(f"{spec.base_dir}: code: name a Python file with make_model(spec)")
    p = Path(path).resolve()
    name = "plinth_fl_app_" + hashlib.sha1(str(p).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    if not p.exists():
        raise SpecError(f"code: {p} does not exist")
    mod_spec = importlib.util.spec_from_file_location(name, p)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    mod_spec.loader.exec_module(module)
    if not hasattr(module, "make_model"):
        raise SpecError(f"{p}: defines no make_model(spec)")
    return module
