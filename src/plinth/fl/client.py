"""The client side: the `Client` protocol users implement, and the runner that speaks messages.

A client is any object with

- ``fit(parameters, config) -> (new_parameters, num_examples, metrics)``
- ``evaluate(parameters, config) -> (loss, num_examples, metrics)``

`ClientRunner.handle(bytes) -> bytes` decodes a message, calls the client, and encodes the reply.
It sends the *delta* (new minus received parameters), compressed as the task asks. An exception in
the user's code becomes an `ErrorRes` reply, so the server sees a failure, not a dead client.

In a SecAgg+ round (`SecAggIns`) the runner trains on the setup message and keeps the round's
state (`plinth.fl.privacy.secagg_round.ClientRound`: its keys, the shares it holds, its
encoded update) until the unmask stage; the plaintext update never leaves the client.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from plinth.fl import serde
from plinth.fl.app import AppSpec, AttackSpec, LocalDPSpec, load_code, seeded_noise
from plinth.fl.compress import Compressor
from plinth.fl.data import Dataset, client_partitions, load_source
from plinth.fl.messages import (
    Config,
    ErrorRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Metrics,
    NDArrays,
    SecAggIns,
)

log = logging.getLogger("plinth.fl.client")


class Client(Protocol):
    def fit(self, parameters: NDArrays, config: Config) -> tuple[NDArrays, int, Metrics]: ...

    def evaluate(self, parameters: NDArrays, config: Config) -> tuple[float, int, Metrics]: ...


class ClientRunner:
    """Turns request bytes into reply bytes for one client, keeping its compressor state."""

    def __init__(self, client: Client, compressor: Compressor | None = None,
                 state_path: Path | None = None,
                 tamper: Callable[[NDArrays, int], NDArrays] | None = None,
                 privatize: Callable[[NDArrays, int], NDArrays] | None = None,
                 secagg_sessions: dict[int, Any] | None = None,
                 noise_seed: int | None = None, secagg_policy: Any = None) -> None:
        self.client = client
        self.privatize = privatize  # local DP (app `privacy.local_dp`): clip + noise the delta
        self.compressor = compressor or Compressor()
        self.tamper = tamper  # a simulated attacker's change to its update (app `attack:`)
        # Virtual clients in a process pool may land on any worker: keep the error-feedback
        # residual in a file so it follows the client, not the process.
        self.state_path = state_path
        # SecAgg+ rounds in progress (round → ClientRound). A pool worker passes the dict it
        # keeps for this client id, so the state outlives this runner (PoolTransport routes a
        # client's messages to one worker).
        self.secagg_sessions: dict[int, Any] = {} if secagg_sessions is None \
            else secagg_sessions
        # distributed DP's noise share: seeded from (noise_seed, round), reproducible for
        # simulation; None draws it from a CSPRNG (ChaChaNoise)
        self.noise_seed = noise_seed
        # what this client accepts in a SecAgg+ setup (its own app's threshold, neighbourhood
        # and graph seed); None: the generic floors only (plinth.fl.privacy.secagg_round)
        self.secagg_policy = secagg_policy

    def handle(self, payload: bytes | bytearray) -> bytearray:
        msg = serde.decode(payload)
        try:
            if isinstance(msg, FitIns):
                return serde.encode(self._fit(msg))
            if isinstance(msg, SecAggIns):
                return serde.encode(self._secagg(msg))
            if isinstance(msg, EvaluateIns):
                loss, n, metrics = self.client.evaluate(msg.parameters, dict(msg.config))
                return serde.encode(EvaluateRes(msg.round, float(loss), int(n), _floats(metrics)))
            return serde.encode(ErrorRes(getattr(msg, "round", -1),
                                         f"client cannot handle {type(msg).__name__}"))
        except Exception as e:  # noqa: BLE001 - user code failed: report it as data
            last = traceback.extract_tb(e.__traceback__)[-1]
            return serde.encode(ErrorRes(msg.round, f"{type(e).__name__}: {e} "
                                                    f"({Path(last.filename).name}:{last.lineno})"))

    def _delta(self, ins: FitIns) -> tuple[NDArrays, bool, int, Metrics]:
        """Train; (the delta, whether it fits the model, examples, metrics)."""
        config = {**ins.config, "round": ins.round}
        new, n, metrics = self.client.fit(ins.parameters, config)
        delta = [_minus(np.asarray(a), np.asarray(b)) for a, b in zip(new, ins.parameters)]
        fits = len(new) == len(ins.parameters) and not any(d is None for d in delta)
        if not fits:
            return list(new), False, int(n), metrics
        if self.tamper is not None:
            delta = self.tamper(delta, ins.round)
        if self.privatize is not None:
            delta = self.privatize(delta, ins.round)
        return delta, True, int(n), metrics

    def _fit(self, ins: FitIns) -> FitRes:
        # a delta that does not fit the model goes as is; the server rejects and logs it
        delta, _, n, metrics = self._delta(ins)
        self._load_residual()
        arrays, codec, meta = self.compressor.encode(delta)
        self._save_residual()
        return FitRes(ins.round, arrays, int(n), _floats(metrics), codec, meta)

    def _secagg(self, ins: SecAggIns) -> Any:
        """One SecAgg+ stage. Setup trains and encodes; the later stages need the round's
        state. A refused message (replayed, out of turn, malformed) is logged and answered with
        an `ErrorRes` (by `handle`), and the round's state stays as it was."""
        from plinth.fl.privacy.secagg import SecAggError
        from plinth.fl.privacy.secagg_messages import Stage
        from plinth.fl.privacy.secagg_round import (
            SETUP,
            ClientRound,
            SetupPolicy,
            check_setup,
            noisy_vector,
            setup_from_meta,
        )

        sessions = self.secagg_sessions
        if ins.stage != SETUP:
            session = sessions.get(ins.round)
            if session is None:
                why = f"{ins.stage} for round {ins.round}, which this client has no state for"
                log.warning("secagg: %s", why)
                raise SecAggError(why)
            res = session.answer(ins)
            if ins.stage == Stage.UNMASK:
                del sessions[ins.round]
            return res
        if ins.round in sessions:
            why = f"a second setup for round {ins.round} (replayed)"
            log.warning("secagg: %s", why)
            raise SecAggError(why)
        cfg, index, dp, fit_config = setup_from_meta(ins.meta)
        try:  # before training: a malicious setup gets nothing, not even public keys
            check_setup(cfg, self.secagg_policy or SetupPolicy())
        except SecAggError as e:
            log.warning("secagg round %d: %s", ins.round, e)
            raise
        delta, fits, _, _ = self._delta(FitIns(ins.round, ins.arrays, fit_config))
        if not fits:
            raise SecAggError("the trained model does not have the server model's shapes")
        noise = None
        if dp is not None:
            from plinth.fl.privacy.dp import ChaChaNoise, NumpyNoise

            noise = (ChaChaNoise() if self.noise_seed is None else
                     NumpyNoise(np.random.default_rng([self.noise_seed, ins.round, 0xDD])))
        flat = np.concatenate([np.asarray(d, np.float64).reshape(-1) for d in delta])
        session = ClientRound(cfg, index, noisy_vector(flat, dp, noise))
        sessions.clear()  # rounds this client dropped out of: their state goes
        sessions[ins.round] = session
        return session.advertise()

    def _load_residual(self) -> None:
        if self.state_path is not None and self.state_path.exists():
            with np.load(self.state_path) as z:
                self.compressor.residual = [z[f"a{i}"] for i in range(len(z.files))]

    def _save_residual(self) -> None:
        r = self.compressor.residual
        if self.state_path is not None and r is not None:
            tmp = self.state_path.with_suffix(".tmp.npz")
            np.savez(tmp, **{f"a{i}": a for i, a in enumerate(r)})
            tmp.replace(self.state_path)


def _minus(new: np.ndarray, old: np.ndarray) -> np.ndarray | None:
    """new − old in old's dtype; None when they cannot be subtracted (wrong shape)."""
    if new.shape != old.shape:
        return None
    if np.issubdtype(old.dtype, np.floating):
        return new - old if new.dtype == old.dtype else new  # a dtype change goes as is
    return (new.astype(np.int64) - old.astype(np.int64)).astype(old.dtype)


def _floats(metrics: dict[str, Any]) -> Metrics:
    return {str(k): float(v) for k, v in (metrics or {}).items()}


class AppClients:
    """Builds the clients of an app: its data split, its model code, one client per id."""

    def __init__(self, spec: AppSpec, num_clients: int, state_dir: str | None = None, *,
                 simulated: bool = False) -> None:
        # simulated (`plinth fl sim`): `noise: auto` means seeded noise; elsewhere a CSPRNG
        self.spec, self.num_clients, self.simulated = spec, num_clients, simulated
        self.code = load_code(spec)
        self.train, self.test = load_source(spec.data, spec.seed)
        self.parts = client_partitions(spec.data, self.train, num_clients, spec.seed)
        self.state_dir = Path(state_dir) if state_dir else None
        self.attackers: frozenset[int] = frozenset()
        self.secagg_sessions: dict[int, dict[int, Any]] = {}  # per client id, see ClientRunner
        if spec.attack is not None:
            from plinth.fl.robust.attacks import choose_attackers

            rng = np.random.default_rng([spec.seed, 0xA77])
            self.attackers = frozenset(int(i) for i in choose_attackers(
                num_clients, spec.attack.fraction, rng))

    def sizes(self) -> list[int]:
        return [len(p) for p in self.parts]

    def client(self, cid: int) -> Client:
        train: Dataset = self.train.subset(self.parts[cid])
        if cid in self.attackers:
            train = poison(train, self.spec.attack, self.spec.seed * 1_000_003 + cid,
                           num_classes=int(self.train.y.max()) + 1)
        if hasattr(self.code, "make_client"):
            return self.code.make_client(cid, train, self.test, self.spec)
        from plinth.fl.torch_client import make_default_client

        model = self.code.make_model(self.spec)
        # each client scores on its own slice of the test split (federated evaluation)
        test = self.test.subset(np.arange(cid, len(self.test), self.num_clients))
        return make_default_client(model, train, test, self.spec.train,
                                   self.spec.seed * 1_000_003 + cid)

    def runner(self, cid: int) -> ClientRunner:
        c = self.spec.compression
        comp = Compressor(c.kind, ratio=c.ratio, error_feedback=c.error_feedback)
        path = None
        if self.state_dir is not None and c.kind == "topk" and c.error_feedback:
            path = self.state_dir / f"client_{cid}.npz"
        tamper = None
        if cid in self.attackers:
            tamper = update_attack(self.spec.attack, self.spec.seed * 1_000_003 + cid)
        privatize = None
        if self.spec.privacy.local_dp is not None:
            privatize = local_dp_privatizer(self.spec.privacy.local_dp, self.spec.seed, cid,
                                            simulated=self.simulated)
        dp = self.spec.privacy.dp
        noise_seed = None
        if dp is not None and seeded_noise(dp.noise, simulated=self.simulated):
            noise_seed = self.spec.seed * 1_000_003 + cid
        return ClientRunner(self.client(cid), comp, path, tamper, privatize,
                            self.secagg_sessions.setdefault(cid, {}), noise_seed,
                            self.secagg_policy())

    def secagg_policy(self) -> Any:
        """The SecAgg+ setup this app's clients accept (None without `privacy.secagg`)."""
        s = self.spec.privacy.secagg
        if s is None:
            return None
        from plinth.fl.privacy.secagg_round import SetupPolicy

        return SetupPolicy(self.spec.seed, s.neighbours, s.full_graph, s.threshold)


def local_dp_privatizer(spec: LocalDPSpec, seed: int, cid: int, *, simulated: bool = False
                        ) -> Callable[[NDArrays, int], NDArrays]:
    """Local DP on the upload: the float arrays of the delta, as one vector, are clipped to L2
    norm `spec.clip` and get N(0, (z·clip)²) per coordinate (`plinth.fl.privacy.dp.local_dp`).

    Seeded noise (`noise: numpy`, or `auto` in simulation) comes from (app seed, client, round):
    reproducible, and so predictable to whoever knows the seed (`plinth fl client` refuses
    numpy); otherwise it is drawn from a CSPRNG. Integer buffers (counters) are sent as they are:
    they are not covered by the guarantee.
    """
    from plinth.fl.privacy.dp import ChaChaNoise, NumpyNoise, local_dp

    seeded = seeded_noise(spec.noise, simulated=simulated)

    def privatize(delta: NDArrays, round: int) -> NDArrays:
        idx = [i for i, d in enumerate(delta) if np.issubdtype(np.asarray(d).dtype, np.floating)]
        if not idx:
            return delta
        flat = np.concatenate([np.asarray(delta[i], np.float64).reshape(-1) for i in idx])
        noise = (NumpyNoise(np.random.default_rng([seed, 0x10CA1, cid, round]))
                 if seeded else ChaChaNoise())
        noisy = local_dp(flat, clip_norm=spec.clip, noise_multiplier=spec.noise_multiplier,
                         noise=noise)
        out = list(delta)
        at = 0
        for i in idx:
            d = np.asarray(delta[i])
            out[i] = np.ascontiguousarray(noisy[at:at + d.size].reshape(d.shape), dtype=d.dtype)
            at += d.size
        return out

    return privatize


def poison(train: Dataset, attack: AttackSpec | None, seed: int, *, num_classes: int) -> Dataset:
    """An attacker's training data: labels flipped, or a share stamped with the backdoor trigger.
    Update attacks leave the data alone."""
    from plinth.fl.robust import attacks

    if attack is None or attack.kind not in ("label_flip", "backdoor"):
        return train
    if attack.kind == "label_flip":
        y = attacks.label_flip(train.y, num_classes=num_classes).astype(train.y.dtype)
        return Dataset(train.x, y, train.users)
    side = trigger_side(train.x.shape[1])
    x, y = attacks.backdoor(train.x, train.y, side=side, target=attack.target,
                            fraction=attack.poison_fraction, rng=np.random.default_rng(seed),
                            patch=attack.patch)
    return Dataset(x.astype(train.x.dtype), y.astype(train.y.dtype), train.users)


def trigger_side(features: int) -> int:
    side = math.isqrt(features)
    if side * side != features:
        raise ValueError(f"attack.kind: backdoor needs square images, got {features} features")
    return side


def update_attack(attack: AttackSpec | None, seed: int
                  ) -> Callable[[NDArrays, int], NDArrays] | None:
    """What an attacker does to its honest update before upload (None: it sends it as is)."""
    from plinth.fl.robust import attacks

    if attack is None or attack.kind in ("label_flip", "backdoor"):
        return None
    kind = attack.kind

    def tamper(delta: NDArrays, round: int) -> NDArrays:
        rng = np.random.default_rng([seed, round])
        out = []
        for d in delta:
            if not np.issubdtype(d.dtype, np.floating):
                out.append(d)  # integer buffers (counters) stay honest
                continue
            if kind == "sign_flip":
                bad = attacks.sign_flip(d, scale=attack.scale or 1.0)
            elif kind == "scale":
                bad = attacks.scaled_update(d, boost=attack.scale or 10.0)
            else:
                bad = attacks.gaussian_noise_update(d, std=attack.std, rng=rng)
            out.append(np.ascontiguousarray(bad, dtype=d.dtype))
        return out

    return tamper
