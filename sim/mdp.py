"""The SpecDec++ draft-length MDP, solved exactly; the oracle bound.

SpecDec++ ([SD++] §4) casts "draft another token or stop and verify?" as a Markov decision
process. A drafted token costs c1 = t_draft; a verification costs t_target, i.e. c2 =
t_target − t_draft on top of the t_draft every output token is charged (Theorem 4.2); the
objective is the long-run latency per token.

The long-run ratio cost/tokens is minimised by the Dinkelbach device: for a price λ per
token, each round's objective is E[cost − λ·tokens]; λ* is the price at which the optimal
average of that objective is zero, and λ* is the optimal latency per token. For a given λ
the round is a finite-horizon DP (at most ``k_max`` drafted tokens) whose state is what the
drafter knows: the number i of tokens drafted, the probability P that all of them will be
accepted, and — for Markov-modulated acceptance with observed regimes — the regime of the
last drafted token. Consecutive rounds are linked through the regime at the round start
(a relative value h per regime), solved by relative value iteration; λ by bisection.

Drafting token j adds its expected acceptance −λ·P_j (P_j = P_{j−1}·α_{r_j}) and, if it
turns out to be the first rejection (probability P_{j−1}(1 − α_{r_j})), fixes the next
round's start regime to r_j; stopping after i tokens adds t_target − λ (the correction or
bonus token) and, if everything was accepted, a start regime drawn from the chain.

Solvers:

* :func:`solve_markov` — Markov-modulated acceptance with observed regimes; Bernoulli is
  the one-regime case. Returns the optimal policy, or evaluates a fixed-k or threshold
  policy exactly under the same model.
* :func:`solve_positional` — acceptance by draft position (no information arrives while
  drafting, so the optimum is a fixed k).
* :func:`solve_trace` — per-token acceptance probabilities along recorded text, known in
  advance: a backward DP over text positions.
* :func:`oracle_latency` — [SD++] Theorem 4.1: with the accept/reject outcomes known, draft
  exactly the accepted tokens: N_target = |rejections| + 1, N_discarded = 0.

[SD++] Huang, Guo, Wang. SpecDec++. 2024 (§4, Theorems 4.1–4.3).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from .distributions import stationary
from .errors import DraftsimError, as_count, as_positive, as_probability

__all__ = [
    "MDPSolution",
    "solve_markov",
    "solve_noisy_markov",
    "predictor_emission",
    "solve_bernoulli",
    "solve_positional",
    "solve_trace",
    "oracle_latency",
    "compare_policies",
]


@dataclass
class MDPSolution:
    """An (optimal or evaluated) drafting policy and its exact latency per token.

    ``decisions`` maps a state (i, counts of drafted tokens per regime, regime of the last
    drafted token) to True (draft another token) or False (stop and verify), for states
    reachable under the policy. ``threshold`` describes whether the decisions are a
    threshold rule on P(at least one rejection) = 1 − P (SpecDec++ Theorem 4.3).
    """

    latency_per_token: float
    policy: str
    decisions: dict = field(default_factory=dict)
    threshold: dict = field(default_factory=dict)
    tokens_per_round: float = float("nan")

    def to_dict(self) -> dict:
        return {
            "latency_per_token": self.latency_per_token,
            "policy": self.policy,
            "threshold": self.threshold,
            "tokens_per_round": self.tokens_per_round,
        }


def _check_times(t_draft, t_target):
    t_draft = float(as_positive("t_draft", t_draft))
    t_target = float(as_positive("t_target", t_target))
    return t_draft, t_target


class _RoundDP:
    """The round DP for Markov-modulated acceptance with observed regimes."""

    def __init__(self, T: np.ndarray, alphas: np.ndarray, t_draft: float, t_target: float, k_max: int, rule):
        self.T, self.alphas = T, alphas
        self.td, self.tt = t_draft, t_target
        self.k_max = k_max
        self.rule = rule  # None (optimise), ("fixed", k) or ("threshold", h)
        self.R = R = len(alphas)
        # States at depth i: all count vectors summing to i, times the last regime.
        self.levels = [np.array([c for c in itertools.product(range(i + 1), repeat=R) if sum(c) == i], dtype=np.int64).reshape(-1, R) for i in range(k_max + 1)]
        self.index = [{tuple(c): n for n, c in enumerate(level)} for level in self.levels]
        self.P = [np.prod(alphas[None, :] ** level, axis=1) for level in self.levels]
        # child[i][n, r'] = index at depth i+1 of counts[n] + e_{r'}
        self.child = []
        for i in range(k_max):
            nxt = self.index[i + 1]
            self.child.append(np.array([[nxt[tuple(c + np.eye(R, dtype=np.int64)[r])] for r in range(R)] for c in self.levels[i]]))

    def solve(self, lam: float, h: np.ndarray):
        """Values V[i] (states × last regime) and decisions, by backward induction."""
        T, a, R = self.T, self.alphas, len(self.alphas)
        bonus_h = T @ h  # E[h(start regime)] after a fully accepted round, per last regime
        V = [None] * (self.k_max + 1)
        go = [None] * (self.k_max + 1)
        for i in range(self.k_max, -1, -1):
            P = self.P[i][:, None]  # (states, 1)
            stop = self.tt - lam + P * bonus_h[None, :]  # (states, last regime)
            if i == self.k_max:
                V[i], go[i] = stop, np.zeros(stop.shape, dtype=bool)
                continue
            child_V = V[i + 1][self.child[i], np.arange(R)[None, :]]  # (states, r')
            step = -lam * P * a[None, :] + P * (1 - a[None, :]) * h[None, :] + child_V  # (states, r')
            cont = self.td + step @ T.T  # (states, last regime): E over the next regime
            decide = self._decide(i, P, cont, stop)
            V[i] = np.where(decide, cont, stop)
            go[i] = decide
        return V, go

    def _decide(self, i, P, cont, stop):
        if self.rule is None:
            return cont < stop
        kind, value = self.rule
        if kind == "fixed":
            return np.full(cont.shape, i < value)
        # threshold: keep drafting while 1 − P ≤ h (stop once the rejection chance exceeds h)
        return np.broadcast_to(1.0 - P <= value, cont.shape).copy()

    def stats(self, go):
        """Per start regime r0: expected round cost C, tokens τ and next-start distribution Q."""
        T, a, R = self.T, self.alphas, self.R
        C, tau, Q = np.zeros(R), np.zeros(R), np.zeros((R, R))
        for r0 in range(R):
            mass = np.zeros((1, R))
            mass[0, r0] = 1.0
            for i in range(self.k_max + 1):
                P = self.P[i][:, None]
                stopping = mass * ~go[i]
                C[r0] += self.tt * stopping.sum()
                tau[r0] += stopping.sum()
                Q[r0] += (stopping * P).sum(axis=0) @ T  # all accepted: the bonus position's regime
                moving = mass * go[i]
                if i == self.k_max or not moving.any():
                    break
                flow = moving @ T  # (states, r'): drafting a token in regime r'
                C[r0] += self.td * flow.sum()
                tau[r0] += (flow * P * a[None, :]).sum()
                Q[r0] += (flow * P * (1 - a[None, :])).sum(axis=0)  # first rejection here
                nxt = np.zeros((len(self.levels[i + 1]), R))
                np.add.at(nxt, (self.child[i], np.broadcast_to(np.arange(R), self.child[i].shape)), flow)
                mass = nxt
        return C, tau, Q


def _ratio_and_bias(C: np.ndarray, tau: np.ndarray, Q: np.ndarray) -> tuple[float, np.ndarray]:
    """Long-run latency λ = π·C / π·τ (π stationary for Q) and relative values h solving
    (I − Q) h = C − λ·τ with h(0) = 0, from per-start-regime round cost C, tokens τ and
    next-start distribution Q."""
    assert np.allclose(Q.sum(axis=1), 1.0), Q.sum(axis=1)  # every round ends in one next start
    R = len(C)
    pi = stationary(Q)
    lam = float(pi @ C / (pi @ tau))
    system = np.vstack([np.eye(R) - Q, np.eye(R)[:1]])
    h = np.linalg.lstsq(system, np.concatenate([C - lam * tau, [0.0]]), rcond=None)[0]
    return lam, h


def _policy_iteration(dp, t_target: float):
    """Policy iteration for the ratio objective: evaluate the decisions exactly (λ, h),
    improve them with the round DP at (λ, h), until they no longer change."""
    _, go = dp.solve(t_target / 2, np.zeros(dp.R))
    seen = set()
    for _ in range(200):
        lam, h = _ratio_and_bias(*dp.stats(go))
        _, new_go = dp.solve(lam, h)
        key = b"".join(g.tobytes() for g in new_go)
        if all(np.array_equal(x, y) for x, y in zip(go, new_go)) or key in seen:
            break
        seen.add(key)
        go = new_go
    lam, h = _ratio_and_bias(*dp.stats(go))
    return lam, go


def _threshold_structure(dp: _RoundDP, go) -> dict:
    """Is 'keep drafting' exactly {1 − P ≤ h} over the states (i < k_max)?"""
    cont_max, stop_min = -np.inf, np.inf
    per_regime = {}
    for i in range(dp.k_max):
        rej = 1.0 - dp.P[i]
        for r in range(len(dp.alphas)):
            c = rej[go[i][:, r]]
            s = rej[~go[i][:, r]]
            lo = float(c.max()) if c.size else -np.inf
            hi = float(s.min()) if s.size else np.inf
            cont_max, stop_min = max(cont_max, lo), min(stop_min, hi)
            prev = per_regime.get(r, (-np.inf, np.inf))
            per_regime[r] = (max(prev[0], lo), min(prev[1], hi))
    is_threshold = cont_max < stop_min
    out = {
        "is_threshold": bool(is_threshold),
        "h_low": None if not np.isfinite(cont_max) else cont_max,
        "h_high": None if not np.isfinite(stop_min) else stop_min,
        "per_regime": {
            int(r): {"is_threshold": bool(lo < hi), "h_low": None if not np.isfinite(lo) else lo, "h_high": None if not np.isfinite(hi) else hi}
            for r, (lo, hi) in per_regime.items()
        },
    }
    return out


def solve_markov(transition, alphas, t_draft: float, t_target: float, k_max: int = 32, policy=None, tol: float = 1e-10) -> MDPSolution:
    """Exact latency-optimal drafting under Markov-modulated acceptance with observed regimes.

    ``policy``: None for the optimum, ``("fixed", k)`` or ``("threshold", h)`` to evaluate
    that policy exactly under the same model. The drafter observes the regime (hence the
    acceptance probability) of each token it drafts.
    """
    T = as_probability("transition", transition)
    a = as_probability("alphas", alphas)
    if T.ndim != 2 or T.shape != (a.size, a.size) or not np.allclose(T.sum(axis=1), 1.0):
        raise DraftsimError("transition must be a stochastic matrix with one row per regime")
    t_draft, t_target = _check_times(t_draft, t_target)
    k_max = int(as_count("k_max", k_max, minimum=1, maximum=256))
    if policy is not None:
        kind, value = policy
        if kind not in ("fixed", "threshold"):
            raise DraftsimError(f"policy must be None, ('fixed', k) or ('threshold', h); got {policy!r}")
    dp = _RoundDP(T, a, t_draft, t_target, k_max, policy)
    lam, go = _policy_iteration(dp, t_target)
    decisions = {}
    for i in range(k_max):
        for n, counts in enumerate(dp.levels[i]):
            for r in range(a.size):
                decisions[(i, tuple(int(x) for x in counts), r)] = bool(go[i][n, r])
    name = "optimal" if policy is None else f"{policy[0]} {policy[1]}"
    return MDPSolution(
        latency_per_token=float(lam),
        policy=name,
        decisions=decisions,
        threshold=_threshold_structure(dp, go),
    )


class _NoisyRoundDP:
    """The round DP when the drafter sees only a noisy predictor of each token's acceptance.

    Regimes follow the Markov chain; drafting a token in regime r emits predictor symbol o
    with probability E[r, o]. The verification reveals the regime of verified tokens (the
    target's probabilities are known after the call), so a round starts from a known regime
    r0, but within a round the drafter's state is its whole symbol history. With unnormalised
    forward measures over the last regime — G_H(r) = P(H, r_i = r) and F_H(r) = P(H, all
    drafted accepted, r_i = r) — every expectation the DP needs is linear in them, and the
    decisions compare quantities scaled by the same P(H). Exact; O(R·|O|^k_max) histories.
    """

    def __init__(self, T, alphas, E, pred_values, t_draft, t_target, k_max, rule):
        self.T, self.alphas, self.E = T, alphas, E
        self.pred = pred_values
        self.td, self.tt, self.k_max, self.rule = t_draft, t_target, k_max, rule
        self.R = R = len(alphas)
        O = E.shape[1]
        # Level i holds R·O^i histories: (start regime, symbols); children of h are h·O + o.
        self.G, self.F, self.prod = [np.eye(R)], [np.eye(R)], [np.ones(R)]
        for _ in range(k_max):
            GT, FT = self.G[-1] @ T, self.F[-1] @ T  # (n, R') regime of the next token
            self.G.append((GT[:, None, :] * E.T[None, :, :]).reshape(-1, R))
            self.F.append((FT[:, None, :] * (alphas[None, None, :] * E.T[None, :, :])).reshape(-1, R))
            self.prod.append((self.prod[-1][:, None] * self.pred[None, :]).reshape(-1))
        self.O = O

    def solve(self, lam: float, h: np.ndarray):
        T, a, E, O = self.T, self.alphas, self.E, self.O
        U, go = [None] * (self.k_max + 1), [None] * (self.k_max + 1)
        for i in range(self.k_max, -1, -1):
            PH = self.G[i].sum(axis=1)
            FT = self.F[i] @ T
            stop = PH * (self.tt - lam) + FT @ h
            if i == self.k_max:
                U[i], go[i] = stop, np.zeros(len(PH), dtype=bool)
                continue
            n = len(PH)
            accepted_next = self.F[i + 1].sum(axis=1).reshape(n, O)  # Σ over o of P(..., token i+1 accepted)
            rejected = (FT[:, None, :] * ((1 - a)[None, None, :] * E.T[None, :, :])) @ h  # (n, O)
            cont = PH * self.td + (-lam * accepted_next + rejected + U[i + 1].reshape(n, O)).sum(axis=1)
            if self.rule is None:
                decide = cont < stop
            elif self.rule[0] == "fixed":
                decide = np.full(n, i < self.rule[1])
            else:
                decide = 1.0 - self.prod[i] <= self.rule[1]
            U[i], go[i] = np.where(decide, cont, stop), decide
        return U, go

    def stats(self, go):
        T, a, O, R = self.T, self.alphas, self.O, self.R
        C, tau, Q = np.zeros(R), np.zeros(R), np.zeros((R, R))
        alive = np.ones(R, dtype=bool)
        start = np.repeat(np.arange(R), 1)  # start regime of each history at level 0
        for i in range(self.k_max + 1):
            PH = self.G[i].sum(axis=1)
            FT = self.F[i] @ T
            stopping = alive & ~go[i]
            np.add.at(C, start[stopping], self.tt * PH[stopping])
            np.add.at(tau, start[stopping], PH[stopping])
            np.add.at(Q, start[stopping], FT[stopping])
            moving = alive & go[i]
            if i == self.k_max or not moving.any():
                break
            np.add.at(C, start[moving], self.td * PH[moving])
            acc = self.F[i + 1].sum(axis=1).reshape(-1, O).sum(axis=1)
            np.add.at(tau, start[moving], acc[moving])
            rej = (FT * (1 - a)[None, :])  # Σ_o E = 1
            np.add.at(Q, start[moving], rej[moving])
            alive = np.repeat(moving, O)
            start = np.repeat(start, O)
        return C, tau, Q


def predictor_emission(transition, alphas, noise: float, n_bins: int = 4):
    """Discretise a logit-normal predictor p̂ = expit(logit α_r + noise·Z) into ``n_bins``
    equal-width bins of p̂: returns the emission matrix E[r, o] and, per symbol, the value a
    calibrated predictor reports (the posterior mean acceptance given the symbol, under the
    chain's stationary regime distribution)."""
    from scipy.special import logit
    from scipy.stats import norm

    a = as_probability("alphas", alphas)
    noise = float(as_positive("noise", noise))
    n_bins = int(as_count("n_bins", n_bins, minimum=2, maximum=16))
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    with np.errstate(divide="ignore"):
        z = (logit(edges)[None, :] - logit(np.clip(a, 1e-12, 1 - 1e-12))[:, None]) / noise
    cdf = norm.cdf(z)
    E = np.diff(cdf, axis=1)
    E = E / E.sum(axis=1, keepdims=True)
    T = as_probability("transition", transition)
    pi = stationary(T)
    joint = pi[:, None] * E
    values = (joint * a[:, None]).sum(axis=0) / np.maximum(joint.sum(axis=0), 1e-300)
    return E, values


def solve_noisy_markov(transition, alphas, emission, pred_values, t_draft: float, t_target: float, k_max: int = 10, policy=None) -> MDPSolution:
    """Exact latency-optimal drafting when the drafter sees a noisy predictor: symbol o with
    probability ``emission[r, o]`` for a token in regime r, reported as ``pred_values[o]``
    (see :func:`predictor_emission`). ``policy`` as in :func:`solve_markov` (a threshold
    uses 1 − Π pred_values). The state is the symbol history, so the cost grows as
    R·|O|^k_max: keep k_max·log|O| small (k_max = 10 with 4 symbols is ~2·10^6 histories).
    """
    T = as_probability("transition", transition)
    a = as_probability("alphas", alphas)
    E = as_probability("emission", emission)
    v = as_probability("pred_values", pred_values)
    if E.shape != (a.size, v.size) or not np.allclose(E.sum(axis=1), 1.0):
        raise DraftsimError("emission must be a (regimes x symbols) stochastic matrix matching pred_values")
    t_draft, t_target = _check_times(t_draft, t_target)
    k_max = int(as_count("k_max", k_max, minimum=1, maximum=64))
    if a.size * v.size**k_max > 4_000_000:
        raise DraftsimError(f"{a.size} regimes x {v.size} symbols ^ k_max={k_max} histories is too many; lower k_max or the symbols")
    dp = _NoisyRoundDP(T, a, E, v, t_draft, t_target, k_max, policy)
    lam, go = _policy_iteration(dp, t_target)
    name = "optimal" if policy is None else f"{policy[0]} {policy[1]}"
    # Threshold structure over histories: is "keep drafting" exactly {1 − Π p̂ ≤ h}?
    cont = [1.0 - dp.prod[i][go[i]] for i in range(k_max)]
    stop = [1.0 - dp.prod[i][~go[i]] for i in range(k_max)]
    c_max = max((float(c.max()) for c in cont if c.size), default=-np.inf)
    s_min = min((float(x.min()) for x in stop if x.size), default=np.inf)
    structure = {"is_threshold": bool(c_max < s_min), "h_low": c_max if np.isfinite(c_max) else None, "h_high": s_min if np.isfinite(s_min) else None}
    return MDPSolution(float(lam), name, {}, structure)


def solve_bernoulli(alpha: float, t_draft: float, t_target: float, k_max: int = 32, policy=None) -> MDPSolution:
    """:func:`solve_markov` with one regime (i.i.d. acceptance α)."""
    return solve_markov([[1.0]], [alpha], t_draft, t_target, k_max, policy)


def solve_positional(alphas, t_draft: float, t_target: float, k_max: int = 32) -> MDPSolution:
    """Acceptance α_i by draft position: nothing is learnt while drafting, so the optimal
    policy drafts a fixed k; latency (k·t_draft + t_target) / (1 + Σ_{j≤k} Π_{l≤j} α_l)."""
    a = as_probability("alphas", alphas)
    t_draft, t_target = _check_times(t_draft, t_target)
    k_max = int(as_count("k_max", k_max, minimum=0, maximum=4096))
    per = a[np.minimum(np.arange(k_max), a.size - 1)]
    tokens = 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(per))])
    latency = (np.arange(k_max + 1) * t_draft + t_target) / tokens
    k = int(np.argmin(latency))
    return MDPSolution(float(latency[k]), f"fixed {k}", {}, {"is_threshold": True, "k": k}, float(tokens[k]))


def solve_trace(probs, t_draft: float, t_target: float, k_max: int = 32, policy=None) -> MDPSolution:
    """Optimal drafting along recorded text whose per-token acceptance probabilities p_t are
    known in advance, by backward induction over positions:

        V(t) = min_k  k·t_draft + t_target + Σ_{j=0..k} P(j accepted) · V(t + j + 1),

    with V = 0 past the end (the last round's extra tokens are not counted). ``probs`` is a
    list of 1-d arrays (one per sequence); the latency is total expected time over total
    tokens. ``policy`` = ("fixed", k) or ("threshold", h) evaluates that policy instead.
    """
    seqs = [as_probability("probs", s) for s in probs]
    t_draft, t_target = _check_times(t_draft, t_target)
    k_max = int(as_count("k_max", k_max, minimum=0, maximum=1024))
    total_time, total_tokens, ks = 0.0, 0, []
    for p in seqs:
        n = len(p)
        V = np.zeros(n + k_max + 2)
        choice = np.zeros(n, dtype=np.int64)
        padded = np.concatenate([p, np.zeros(k_max + 1)])
        for t in range(n - 1, -1, -1):
            run = np.concatenate([[1.0], np.cumprod(padded[t : t + k_max])])  # P(first j accepted), j = 0..k_max
            # P(exactly j accepted | k drafted) = run[j](1 − p_{t+j}) for j < k, run[k] for j = k.
            exact = run[:-1] * (1.0 - padded[t : t + k_max])
            future = V[t + 1 : t + k_max + 2]  # V(t + j + 1), j = 0..k_max
            partial = np.concatenate([[0.0], np.cumsum(exact * future[:-1])])  # Σ_{j<k}
            values = np.arange(k_max + 1) * t_draft + t_target + partial + run * future
            if policy is None:
                k = int(np.argmin(values))
            elif policy[0] == "fixed":
                k = min(int(policy[1]), k_max)
            else:  # threshold: the first k with 1 − Π_{l<k} p > h, drafting at least one token
                over = np.flatnonzero(1.0 - run[1:] > policy[1])
                k = int(over[0] + 1) if over.size else k_max
            choice[t] = k
            V[t] = values[k]
        total_time += V[0]
        total_tokens += n
        ks.append(choice)
    name = "optimal" if policy is None else f"{policy[0]} {policy[1]}"
    return MDPSolution(total_time / max(total_tokens, 1), name, {"k_by_position": ks}, {})


def oracle_latency(outcomes, t_draft: float, t_target: float) -> dict:
    """[SD++] Theorem 4.1: knowing which drafted tokens the target would accept (greedy match
    flags along its output), draft exactly those: N_target = |rejections| + 1 per sequence,
    N_discarded = 0. ``outcomes`` is a list of 0/1 arrays (1 = the draft's token matches).

    Returns latency per token, the counts and the speedup over autoregressive decoding.
    """
    t_draft, t_target = _check_times(t_draft, t_target)
    n_tokens = n_target = n_accepted = 0
    for flags in outcomes:
        f = np.asarray(flags)
        if f.ndim != 1 or not np.isin(f, (0, 1)).all():
            raise DraftsimError("oracle outcomes must be 1-d arrays of 0/1 match flags")
        n = len(f)
        rejected = int((f == 0).sum())
        n_tokens += n
        n_target += rejected + (1 if n and f[-1] == 1 else 0) if n else 0
        n_accepted += n - rejected - (1 if n and f[-1] == 1 else 0)
    latency = (t_draft * n_accepted + t_target * n_target) / max(n_tokens, 1)
    return {
        "latency_per_token": latency,
        "n_tokens": n_tokens,
        "n_target": n_target,
        "n_discarded": 0,
        "speedup": t_target / latency if latency > 0 else float("inf"),
    }


def compare_policies(transition, alphas, t_draft: float, t_target: float, k_max: int = 32, thresholds=None) -> dict:
    """Optimal MDP policy, best fixed k, best threshold (on 1 − Π p) and the oracle, on one
    Markov-modulated workload, all evaluated exactly (the oracle in expectation: every
    position is drafted and accepted with its regime's α, or is a correction)."""
    thresholds = np.linspace(0.0, 1.0, 101) if thresholds is None else np.asarray(thresholds)
    opt = solve_markov(transition, alphas, t_draft, t_target, k_max)
    fixed = min((solve_markov(transition, alphas, t_draft, t_target, k_max, ("fixed", k)) for k in range(0, k_max + 1)), key=lambda s: s.latency_per_token)
    thr = min((solve_markov(transition, alphas, t_draft, t_target, k_max, ("threshold", float(h))) for h in thresholds), key=lambda s: s.latency_per_token)
    T = np.asarray(transition, dtype=float)
    pi = stationary(T)
    acc = float(pi @ np.asarray(alphas, dtype=float))
    oracle = t_draft * acc + t_target * (1.0 - acc)  # per token: drafted-and-accepted or a target call
    return {
        "optimal": opt.latency_per_token,
        "best_fixed_k": {"k": int(fixed.policy.split()[1]), "latency_per_token": fixed.latency_per_token},
        "best_threshold": {"h": float(thr.policy.split()[1]), "latency_per_token": thr.latency_per_token},
        "oracle": oracle,
        "autoregressive": t_target,
        "optimal_threshold_structure": opt.threshold,
    }
