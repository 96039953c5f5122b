"""Decentralised training from an app YAML (`plinth fl admm`, `plinth fl admm-site`).

Each round every site trains the current model on its own partition of the app's data (the app's
client code: `AppClients`), then the sites average their models by consensus ADMM over the
Kirkman schedule (weights = partition sizes), talking over the gRPC peer exchange. There is no
server: every site ends the round holding the same averaged model z.

`run_admm_app` is a loopback launcher (one process per site on 127.0.0.1). For measurement only,
each site also hands its launcher its trained model, so the launcher can report how far z is
from the exact weighted average; the sites themselves never see each other's models.
`run_site` is one site as its own `plinth` process, given the address of every site.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from plinth.core.errors import SpecError
from plinth.fl.admm.consensus import ADMMConfig, Site
from plinth.fl.admm.kirkman import kirkman_triple_system
from plinth.fl.admm.loopback import PeerSecurity, run_sites, site_loop, token_of
from plinth.fl.app import AdmmSpec, AppSpec, load_app
from plinth.fl.messages import NDArrays
from plinth.fl.transport.grpc import load_tokens, read_pem
from plinth.fl.transport.peer import PeerExchange


def admm_spec(spec: AppSpec) -> AdmmSpec:
    """The app's `admm:` section; settings that need a server are refused, naming the field."""
    a = spec.admm or AdmmSpec()
    refused = {"privacy.dp": spec.privacy.dp, "privacy.local_dp": spec.privacy.local_dp,
               "privacy.secagg": spec.privacy.secagg, "attack": spec.attack,
               "strategy.robust": spec.strategy.robust, "consent": spec.consent}
    for name, on in refused.items():
        if on is not None:
            raise SpecError(f"{name}: not applied by plinth fl admm (there is no server); "
                            f"remove it")
    if spec.compression.kind != "none":
        raise SpecError("compression.kind: plinth fl admm sends ADMM shares, not compressed "
                        "updates; use none")
    return a


def admm_config(a: AdmmSpec) -> ADMMConfig:
    return ADMMConfig(rho0=a.rho, rho_decay=a.rho_decay, lambda_std=a.lambda_std,
                      iterations=a.iterations)


def load_admm_app(app_path: str, *, sites: int | None = None, rounds: int | None = None,
                  overrides: dict[str, Any] | None = None) -> tuple[AppSpec, AdmmSpec]:
    ov = dict(overrides or {})
    ov.update({k: x for k, x in (("admm.sites", sites), ("admm.rounds", rounds)) if x is not None})
    spec = load_app(app_path, ov)
    a = admm_spec(spec)
    # one data partition per site
    spec = load_app(app_path, {**ov, "admm.sites": a.sites, "data.clients": a.sites})
    return spec, admm_spec(spec)


def flatten(arrays: NDArrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def unflatten(flat: np.ndarray, like: NDArrays) -> NDArrays:
    out, at = [], 0
    for a in like:
        a = np.asarray(a)
        piece = flat[at:at + a.size].reshape(a.shape)
        if not np.issubdtype(a.dtype, np.floating):
            piece = np.rint(piece)
        out.append(piece.astype(a.dtype))
        at += a.size
    return out


def security(spec: AppSpec, sites: int) -> PeerSecurity | None:
    """Tokens and TLS from the app's `transport:` (token file ids are site numbers); None when
    it names neither (the launcher then makes one random token per site)."""
    t = spec.transport
    tokens = load_tokens(spec.resolve(t.tokens)) if t.tokens else None  # type: ignore[arg-type]
    if tokens is not None:
        missing = [i for i in range(sites) if token_of(tokens, i) is None]
        if missing:
            raise SpecError(f"transport.tokens: no token for sites {missing} (ids are site "
                            f"numbers 0..{sites - 1})")
    tls = t.tls
    if tokens is None and tls is None:
        return None
    pem = {k: read_pem(spec.resolve(getattr(tls, k)), f"transport.tls.{k}") if tls else None
           for k in ("cert", "key", "ca")}
    return PeerSecurity(tokens, None, pem["cert"], pem["key"], pem["ca"])


def train_site(spec: AppSpec, a: AdmmSpec, ex: Any, params: NDArrays,
               report: Callable[[dict[str, Any], NDArrays], None],
               ready: Callable[[], None] | None = None) -> NDArrays:
    """One site's whole task over an Exchange: `a.rounds` of local training, then ADMM.
    ``ready()`` once its data and model are loaded; after each round
    ``report(record, averaged_model)``."""
    import torch

    from plinth.fl.client import AppClients

    torch.set_num_threads(1)  # v sites share the machine's cores
    me, v = ex.me, a.sites
    clients = AppClients(spec, v)
    client = clients.client(me)
    sizes = clients.sizes()
    pi = sizes[me] / sum(sizes)
    design = kirkman_triple_system(v)
    config = admm_config(a)
    iters = config.num_iterations(v)
    fit_config: dict[str, Any] = {"epochs": a.local_epochs} if a.local_epochs else {}
    if ready is not None:
        ready()
    for r in range(1, a.rounds + 1):
        new, n, metrics = client.fit(params, {**fit_config, "round": r})
        w = flatten(new)
        # a fresh secret stream per round (OS CSPRNG), never from the app's seed: every site
        # holds the YAML and could replay a seeded stream (tests/fl/test_admm_seed_replay.py)
        history = site_loop(Site(me, w, pi, config), design, iters, ex)
        params = unflatten(history[-1], new)
        report({"round": r, "w": w, "n": int(n), "train_loss": metrics.get("train_loss"),
                "history": np.stack(history) if me == 0 else None,
                "z_digest": hashlib.sha256(history[-1].tobytes()).hexdigest()}, params)
    return params


def _site_job(ex: PeerExchange, report: Callable[[Any], None], app_path: str,
              overrides: dict[str, Any], params: NDArrays) -> None:
    spec, a = load_admm_app(app_path, overrides=overrides)
    train_site(spec, a, ex, params, lambda rec, _model: report(rec),
               lambda: report({"ready": True}))


def run_admm_app(app_path: str, *, sites: int | None = None, rounds: int | None = None,
                 overrides: dict[str, Any] | None = None,
                 on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the app's ADMM task with one process per site on loopback; a `plinth fl sim`-like
    result dict (rounds with round/accuracy/loss/seconds, final_accuracy) plus ADMM errors."""
    from plinth.fl.rounds import central_evaluator, initial_model

    spec, a = load_admm_app(app_path, sites=sites, rounds=rounds, overrides=overrides)
    ov = {**(overrides or {}), "admm.sites": a.sites, "admm.rounds": a.rounds,
          "data.clients": a.sites}
    v = a.sites
    iters = admm_config(a).num_iterations(v)
    kirkman_triple_system(v)  # fail here, not in v processes, if the design cannot be built
    model, params = initial_model(spec)
    evaluate = central_evaluator(spec, model)
    sec = security(spec, v)
    path = str(Path(app_path).resolve())
    pending: dict[int, dict[int, dict[str, Any]]] = {}
    records: list[dict[str, Any]] = []
    clock = [time.perf_counter()]
    like = params

    ready: set[int] = set()

    def collect(site: int, rep: dict[str, Any]) -> None:
        if rep.get("ready"):  # round 1's seconds start when every site has loaded its data
            ready.add(site)
            if len(ready) == v:
                clock[0] = time.perf_counter()
            return
        got = pending.setdefault(rep["round"], {})
        got[site] = rep
        if len(got) < v:
            return
        del pending[rep["round"]]
        if len({g["z_digest"] for g in got.values()}) != 1:
            raise SpecError(f"round {rep['round']}: sites disagree on the averaged model")
        n = np.array([got[i]["n"] for i in range(v)], np.float64)
        exact = (n / n.sum()) @ np.stack([got[i]["w"] for i in range(v)])
        scale = max(float(np.max(np.abs(exact))), 1e-12)
        errors = [float(np.max(np.abs(z - exact)) / scale) for z in got[0]["history"]]
        loss, metrics = evaluate(unflatten(got[0]["history"][-1], like))
        losses = [g["train_loss"] for g in got.values() if g["train_loss"] is not None]
        now = time.perf_counter()
        rec = {"round": rep["round"], "accuracy": metrics.get("accuracy"), "loss": loss,
               "seconds": round(now - clock[0], 4), "admm_error": errors[-1],
               "admm_errors": errors,
               "train_loss": float(np.mean(losses)) if losses else None}
        clock[0] = now
        records.append(rec)
        if on_round is not None:
            on_round(rec)

    t0 = time.perf_counter()
    run_sites(v, _site_job, [(path, ov, params)] * v, security=sec,
              chunk_size=spec.transport.chunk_size, timeout=a.timeout, on_report=collect)
    accs = [r["accuracy"] for r in records if r["accuracy"] is not None]
    return {"app": spec.name, "strategy": "admm", "clients": v, "sites": v,
            "partition": spec.data.partition,
            "admm": {"rho": a.rho, "rho_decay": a.rho_decay, "lambda_std": a.lambda_std,
                     "iterations": iters, "local_epochs": a.local_epochs or spec.train.epochs,
                     "transport": "grpc", "tls": sec is not None and sec.cert is not None},
            "rounds": records, "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            "max_admm_error": max((r["admm_error"] for r in records), default=None),
            "total_seconds": round(time.perf_counter() - t0, 3)}


def read_peers(peers: str | None, peers_file: str | None) -> list[str]:
    """Site addresses in site order, from ``--peers a,b,c`` or a file of one address a line."""
    if (peers is None) == (peers_file is None):
        raise SpecError("--peers: give either --peers HOST:PORT,... or --peers-file FILE")
    if peers is not None:
        return [p.strip() for p in peers.split(",") if p.strip()]
    try:
        lines = Path(peers_file).read_text().splitlines()  # type: ignore[arg-type]
    except OSError as e:
        raise SpecError(f"--peers-file: cannot read {peers_file} ({e.strerror})") from None
    return [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]


def run_site(app_path: str, *, site: int, addresses: Sequence[str], rounds: int | None = None,
             token: str | None = None,
             on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Be site `site` of the app's ADMM task in this process; `addresses[i]` is site i's
    HOST:PORT (this site listens on its own). Reports its own test accuracy each round."""
    from plinth.fl.rounds import central_evaluator, initial_model

    spec, a = load_admm_app(app_path, sites=len(addresses), rounds=rounds)
    if not 0 <= site < a.sites:
        raise SpecError(f"--site: must be in 0..{a.sites - 1} (one per --peers entry), "
                        f"got {site}")
    sec = security(spec, a.sites) or PeerSecurity()
    own = token or spec.transport.token or os.environ.get("PLINTH_FL_TOKEN") \
        or token_of(sec.tokens, site)
    model, params = initial_model(spec)
    evaluate = central_evaluator(spec, model)
    ex = PeerExchange(site, a.sites, addresses[site], tokens=sec.tokens, token=own,
                      cert=sec.cert, key=sec.key, ca=sec.ca,
                      chunk_size=spec.transport.chunk_size, timeout=a.timeout)
    records: list[dict[str, Any]] = []
    clock = [time.perf_counter()]

    def scored(rep: dict[str, Any], averaged: NDArrays) -> None:
        loss, metrics = evaluate(averaged)
        now = time.perf_counter()
        rec = {"round": rep["round"], "accuracy": metrics.get("accuracy"), "loss": loss,
               "seconds": round(now - clock[0], 4), "train_loss": rep["train_loss"]}
        clock[0] = now
        records.append(rec)
        if on_round is not None:
            on_round(rec)

    try:
        ex.connect(addresses)
        train_site(spec, a, ex, params, scored)
    finally:
        ex.close()
    return {"app": spec.name, "strategy": "admm", "site": site, "sites": a.sites,
            "rounds": records, "final_accuracy": records[-1].get("accuracy") if records else None}
