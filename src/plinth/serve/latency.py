"""The latency model: each job is a c-server queue, evaluated for many jobs at once with numpy.

A job with arrival rate λ (requests/s), c replicas and mean service time p is an M/M/c queue. The
probability that a request waits is Erlang C, and its waiting time beyond that is exponential with
rate cμ − λ, so the q-th percentile of the wait is ln(C / (1 − q)) / (cμ − λ). Service times are
closer to constant than exponential, and the M/D/c wait is about half the M/M/c wait, so the wait is
halved before p is added.

Two relaxations keep the function usable by an optimiser:

- c may be fractional: Erlang B is extended to real c through the regularised incomplete gamma
  function, B(c, a) = (aᶜ e⁻ᵃ / Γ(c + 1)) / Q(c + 1, a), which equals the usual recursion at integers;
- utilisation is capped at ρ_max = 0.95. Above it the latency is computed at λ' = ρ_max·c/p and
  multiplied by λ/λ', so it stays finite and keeps growing with the load.
"""

from __future__ import annotations

import numpy as np
from scipy.special import gammaincc, gammaln

RHO_MAX = 0.95
MIN_REPLICAS = 1e-3  # c below this is treated as this: a job with no replica gets a huge latency


def erlang_c(c: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Probability of waiting in M/M/c with offered load a = λ/μ < c (vectorised, real c)."""
    c = np.asarray(c, dtype=float)
    a = np.asarray(a, dtype=float)
    safe_a = np.maximum(a, 1e-300)
    log_num = c * np.log(safe_a) - safe_a - gammaln(c + 1.0)
    tail = gammaincc(c + 1.0, safe_a)  # P(Poisson(a) <= c) at integer c
    b = np.exp(log_num) / np.maximum(tail, 1e-300)
    b = np.clip(b, 0.0, 1.0)
    rho = a / c
    out = b / (1.0 - rho * (1.0 - b))
    return np.where(a > 0, np.clip(out, 0.0, 1.0), 0.0)


def latency(lam: np.ndarray, c: np.ndarray, p: np.ndarray, *, q: float = 0.99,
            rho_max: float = RHO_MAX) -> np.ndarray:
    """The q-th percentile latency (s): half the M/M/c q-percentile wait plus p. Broadcasts."""
    lam, c, p = np.broadcast_arrays(np.asarray(lam, float), np.asarray(c, float),
                                    np.asarray(p, float))
    lam = np.maximum(lam, 0.0)
    c = np.maximum(c, MIN_REPLICAS)
    cap = rho_max * c / p
    over = lam > cap
    lam_eff = np.where(over, cap, lam)
    a = lam_eff * p
    pw = erlang_c(c, a)
    gap = c / p - lam_eff  # cμ − λ, at least (1 − ρ_max)·c/p > 0
    wait = np.log(np.maximum(pw, 1e-300) / (1.0 - q)) / gap
    wait = np.where(pw > (1.0 - q), wait, 0.0)
    base = p + 0.5 * wait
    return np.where(over, base * lam / np.maximum(lam_eff, 1e-300), base)


def erlang_c_recursive(c: int, a: float) -> float:
    """Textbook Erlang C at integer c via the Erlang B recursion (for tests and checks)."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))
