"""Verification rules: what distribution π a verified token follows, and how to get it.

A rule maps a draft row ``q`` and a target row ``p`` to the distribution ``π`` that the
verified token must follow (π = p for lossless speculative decoding). Speculative sampling
towards π — accept the drafted x ~ q with probability min(1, π(x)/q(x)), otherwise sample
from norm(max(0, π − q)) — produces exactly π and rejects with probability TV(q, π), the
least any scheme can ([SC] §3, Algorithm 4). Every rule here is that, except where it states
another accept/residual pair (Lossy with an explicit β, Leniency).

The same rule objects serve the exact enumerations (:mod:`draftsim.sim.exact`), the samplers
(:mod:`draftsim.sim.verify`, :mod:`draftsim.sim.tree`), the simulators and the real executor. All methods are
vectorised over leading axes of ``q`` and ``p`` (rows along the last axis).

References
----------
[SC]  Narasimhan et al. Faster Cascades via Speculative Decoding. ICLR 2025: Table 1,
      eqs. 2 (Chow), 5 (Diff), 10 (OPT), 11 and 13–15 (token-specific), Lemma 3 (lossy
      speculative sampling), Lemma 5 (rejection rate δ·TV), Algorithms 4 and 6.
[CSD] Chen et al. Cascade Speculative Drafting. NeurIPS 2024, §3.1 (leniency).
[BiLD] Kim et al. Speculative Decoding with Big Little Decoder. NeurIPS 2023.
"""

from __future__ import annotations

import numpy as np

from .distributions import capped_ratio, kl_divergence, normalize, tv_distance
from .errors import DraftsimError, as_float_array, as_probability
from .params import Entry, Param, Parametrised, Registry, ascii_float

__all__ = [
    "Rule",
    "SD",
    "Lossy",
    "Chow",
    "Diff",
    "OPT",
    "TokenV1",
    "TokenV2",
    "TokenV3",
    "BiLD",
    "Leniency",
    "DISCREPANCIES",
    "parse_rule",
    "RULE_HELP",
]


def _gather(rows: np.ndarray, x) -> np.ndarray:
    """rows[..., x] with x broadcast over the leading axes."""
    x = np.asarray(x)
    return np.take_along_axis(rows, x[..., None], axis=-1)[..., 0]


class Rule(Parametrised):
    """A verification rule. Subclasses define :meth:`target` (π); the rest follows.

    Attributes
    ----------
    lossless : bool
        True when π = p for every q and p (the output keeps the target's distribution).
    draft_only : bool
        True when the rule's deferral reads the draft's distribution q alone, so that a
        sequential token cascade ([SC] Algorithm 2) can decide before calling the target.
    """

    lossless = False
    draft_only = False

    def target(self, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        """The distribution π the verified token follows, rows along the last axis."""
        raise NotImplementedError

    def acceptance(self, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        """Probability of accepting each possible drafted token: min(1, π/q) (1 where q = 0)."""
        pi = self.target(q, p)
        return capped_ratio(pi, q)

    def accept_prob(self, q: np.ndarray, p: np.ndarray, x) -> np.ndarray:
        """Probability of accepting the drafted token ``x`` (one id per row)."""
        return _gather(self.acceptance(q, p), x)

    def residual(self, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        """Distribution sampled after a rejection: norm(max(0, π − q)).

        Where it has no mass the rejection probability is 0; π is returned there.
        """
        pi = self.target(q, p)
        return normalize(np.maximum(0.0, pi - q), fallback=pi)

    def rejection_rate(self, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        """P(reject) = 1 − Σ_x q(x)·acceptance(x)."""
        return 1.0 - (q * self.acceptance(q, p)).sum(axis=-1)

    def output(self, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        """Distribution of the verified token under this rule's accept/residual pair.

        q·acceptance + P(reject)·residual; equal to :meth:`target` for every rule here
        (the property tests check it).
        """
        a = self.acceptance(q, p)
        accepted = q * a
        return accepted + (1.0 - accepted.sum(axis=-1, keepdims=True)) * self.residual(q, p)

    # Greedy decoding (temperature 0). The rule's decisions are taken on the untempered
    # distributions q and p; the emitted token is the mode of π. For SD that is argmax p: the
    # target's own greedy output.

    def greedy_choice(self, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        """The token greedy verification emits where it does not keep the draft: argmax π."""
        return self.target(q, p).argmax(axis=-1)

    def greedy_accept(self, q: np.ndarray, p: np.ndarray, x) -> np.ndarray:
        """Whether greedy verification keeps the drafted token ``x``: x = argmax π."""
        return np.asarray(x) == self.greedy_choice(q, p)



class SD(Rule):
    """Lossless speculative sampling: π = p (Leviathan et al. 2023; Chen et al. 2023)."""

    lossless = True

    def target(self, q, p):
        return np.asarray(p, dtype=np.float64)

    def acceptance(self, q, p):
        return capped_ratio(p, q)

    def accept_prob(self, q, p, x):
        qx, px = _gather(q, x), _gather(p, x)
        return capped_ratio(px, qx)

    def residual(self, q, p):
        weights = np.subtract(p, q)
        np.maximum(weights, 0.0, out=weights)
        return normalize(weights, fallback=p)


def _check_alpha(name: str, alpha: float, *, upper_open: bool = False) -> float:
    value = float(as_probability(name, alpha))
    if upper_open and value >= 1.0:
        raise DraftsimError(f"{name} must lie in [0, 1); got {value!r}")
    return value


class Lossy(Rule):
    """Lossy speculative sampling ([SC] Lemma 3, after Tran-Thien 2023).

    Accept the drafted x with probability min(1, p(x)/((1 − α)·q(x))); on rejection sample
    from norm(max(0, p/β − q)). With β chosen so that the output is normalised (the default,
    ``beta=None``, solved exactly per row) the output distribution is::

        π = max{min{q, p/(1 − α)}, p/β},

    which :meth:`closed_form` returns. With an explicit β ≥ 1 − α the accept/residual pair is
    used as given and :meth:`target` is its exact output distribution. α = 0 gives β = 1 and
    π = p (speculative sampling).

    Parameters
    ----------
    alpha : float in [0, 1)
    beta : float >= 1 − alpha, or None (normalising β per row)
    """

    def __init__(self, alpha: float, beta: float | None = None):
        self.alpha = _check_alpha("alpha", alpha, upper_open=True)
        if beta is not None:
            b = float(as_float_array("beta", beta))
            if np.isnan(b) or b < 1.0 - self.alpha:
                raise DraftsimError(f"beta must be >= 1 - alpha = {1.0 - self.alpha:g}; got {b!r}")
            beta = b
        self.beta = beta

    def normalising_beta(self, q, p) -> np.ndarray:
        """β per row with Σ max{min{q, p/(1 − α)}, p/β} = 1 (inf when min{q, p/(1−α)} = q).

        S(β) = Σ max{m, p/β} with m = min{q, p/(1 − α)} falls from 1/(1 − α) at β = 1 − α to
        Σ m ≤ 1 as β → ∞. For A = {p/β > m}, S(β) ≥ P(A)/β + m(Aᶜ) with equality at β, so the
        update β ← P(A)/(1 − m(Aᶜ)) never overshoots the root and strictly increases while
        S(β) > 1; A shrinks at every step, so it stops after at most V steps (a handful in
        practice), each O(V) and vectorised over rows.
        """
        q = np.asarray(q, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        q, p = np.broadcast_arrays(q, p)
        m = np.minimum(q, p / (1.0 - self.alpha))
        m_total = m.sum(axis=-1)
        saturated = m_total >= 1.0 - 1e-15  # q <= p/(1 − α) everywhere: never reject
        beta = np.full(q.shape[:-1], 1.0 - self.alpha)
        for _ in range(q.shape[-1] + 1):
            in_a = p > beta[..., None] * m  # p/β > m, without dividing
            p_a = np.where(in_a, p, 0.0).sum(axis=-1)
            m_out = m_total - np.where(in_a, m, 0.0).sum(axis=-1)
            with np.errstate(divide="ignore", invalid="ignore"):
                new = np.where(saturated, beta, p_a / (1.0 - m_out))
            if not np.any(new > beta):
                break
            beta = np.maximum(beta, new)
        return np.where(saturated, np.inf, beta)

    def _beta(self, q, p):
        if self.beta is not None:
            return np.asarray(self.beta)[..., None]
        return self.normalising_beta(q, p)[..., None]

    def closed_form(self, q, p) -> np.ndarray:
        """π = max{min{q, p/(1 − α)}, p/β} ([SC] Lemma 3)."""
        q = np.asarray(q, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        return np.maximum(np.minimum(q, p / (1.0 - self.alpha)), p / self._beta(q, p))

    def acceptance(self, q, p):
        scaled = np.asarray(p) / (1.0 - self.alpha)
        return capped_ratio(scaled, q)

    def accept_prob(self, q, p, x):
        return capped_ratio(_gather(np.asarray(p), x) / (1.0 - self.alpha), _gather(np.asarray(q), x))

    def residual(self, q, p):
        p = np.asarray(p, dtype=np.float64)
        return normalize(np.maximum(0.0, p / self._beta(q, p) - q), fallback=p)

    def target(self, q, p):
        if self.beta is None:
            return self.closed_form(q, p)
        return self.output(q, p)


class _AlphaRule(Rule):
    """A rule with one lenience parameter α ∈ [0, 1]."""

    def __init__(self, alpha: float):
        self.alpha = _check_alpha("alpha", alpha)


class _DeferralRule(_AlphaRule):
    """π = (1 − δ)·q + δ·p for a deferral decision δ(q, p) ∈ {0, 1} per row ([SC] §3).

    Rejection probability δ·TV(p, q) ([SC] Lemma 5).
    """

    def defer(self, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        """δ(q, p) per row (boolean)."""
        raise NotImplementedError

    def target(self, q, p):
        q = np.asarray(q, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        return np.where(self.defer(q, p)[..., None], p, q)

    def accept_prob(self, q, p, x):
        # π(x) = p(x) where the row defers, q(x) (always accepted) where it does not.
        q = np.asarray(q, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        sd = capped_ratio(_gather(p, x), _gather(q, x))
        return np.where(self.defer(q, p), sd, 1.0)


class Chow(_DeferralRule):
    """Chow's rule: defer when the draft is unsure, δ = 1[max q < 1 − α] ([SC] eq. 2)."""

    #: δ reads q alone, so a sequential cascade ([SC] Algorithm 2) can decide before calling the target.
    draft_only = True

    def defer(self, q, p):
        return np.asarray(q).max(axis=-1) < 1.0 - self.alpha


class Diff(_DeferralRule):
    """Confidence difference: δ = 1[max q < max p − α] ([SC] eq. 5)."""

    def defer(self, q, p):
        return np.asarray(q).max(axis=-1) < np.asarray(p).max(axis=-1) - self.alpha


class OPT(_DeferralRule):
    """The optimal deferral for speculative cascades: δ = 1[max q < max p − α·TV(p, q)] ([SC] eq. 10)."""

    def defer(self, q, p):
        return np.asarray(q).max(axis=-1) < np.asarray(p).max(axis=-1) - self.alpha * tv_distance(p, q)


#: Discrepancy metrics D(q, p) for BiLD* ([SC] §E.1).
DISCREPANCIES = {
    "tv": lambda q, p: tv_distance(p, q),
    "kl": lambda q, p: kl_divergence(p, q),
    # BiLD's own: the draft's cross-entropy on the target's argmax token.
    "nll": lambda q, p: -np.log(np.maximum(_gather(q, np.asarray(p).argmax(axis=-1)), 1e-300)),
}


class BiLD(_DeferralRule):
    """BiLD*: defer when the models disagree, δ = 1[D(q, p) > α] ([SC] Table 1; [BiLD]).

    ``discrepancy`` is one of ``"tv"`` (total variation), ``"kl"`` (KL(p ‖ q)) or ``"nll"``
    (−log q(argmax p), BiLD's rollback metric). α ≥ 0 (unbounded for kl and nll).
    """

    def __init__(self, alpha: float, discrepancy: str = "tv"):
        value = float(as_float_array("alpha", alpha))
        if not (np.isfinite(value) and value >= 0):
            raise DraftsimError(f"alpha must be finite and >= 0; got {value!r}")
        if discrepancy not in DISCREPANCIES:
            raise DraftsimError(f"discrepancy must be one of {sorted(DISCREPANCIES)}; got {discrepancy!r}")
        self.alpha = value
        self.discrepancy = discrepancy

    def defer(self, q, p):
        return DISCREPANCIES[self.discrepancy](np.asarray(q), np.asarray(p)) > self.alpha


class _TokenRule(_AlphaRule):
    """Token-specific cascades ([SC] §5, eq. 11): keep the draft token v when v ∈ A(q, p).

    π(v) = q(v)·1[v ∈ A] + p(v)·q(Aᶜ): the draft's mass on tokens it may keep stays, the
    mass on the others is handed to the target's distribution.
    """

    def keep(self, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        """Boolean rows: tokens the draft may keep."""
        raise NotImplementedError

    def target(self, q, p):
        q = np.asarray(q, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        keep = self.keep(q, p)
        handed = np.where(keep, 0.0, q).sum(axis=-1, keepdims=True)
        return np.where(keep, q, 0.0) + p * handed


class TokenV1(_TokenRule):
    """Keep v when the draft's own probability of it is high: q(v) ≥ max p − α ([SC] eq. 13)."""

    def keep(self, q, p):
        return np.asarray(q) >= np.asarray(p).max(axis=-1, keepdims=True) - self.alpha


class TokenV2(_TokenRule):
    """Keep v when the target rates it near its mode: p(v) ≥ max p − α ([SC] eq. 14)."""

    def keep(self, q, p):
        return np.asarray(p) >= np.asarray(p).max(axis=-1, keepdims=True) - self.alpha


class TokenV3(_TokenRule):
    """Keep v when the target rates it within a factor of its mode: p(v) ≥ (1 − α)·max p ([SC] eq. 15)."""

    def keep(self, q, p):
        return np.asarray(p) >= (1.0 - self.alpha) * np.asarray(p).max(axis=-1, keepdims=True)

    def closed_form(self, q, p) -> np.ndarray:
        """π(v) = q(v)·1[p(v) ≥ (1−α) max p] + p(v)·Σ_{v': p(v') < (1−α) max p} q(v'), written out."""
        q = np.asarray(q, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        threshold = (1.0 - self.alpha) * p.max(axis=-1, keepdims=True)
        kept = p >= threshold
        return q * kept + p * (q * ~kept).sum(axis=-1, keepdims=True)


class Leniency(Rule):
    """CS Drafting's lenient verification ([CSD] §3.1): accept x with min(1, l·p(x)/q(x)).

    On rejection the token is sampled from norm(max(0, p − q)) (from p where that has no
    mass), so the output is min(q, l·p) + P(reject)·norm(max(0, p − q)) — not p unless
    l = 1: **lossy when it verifies for the target**. Inside a vertical cascade (a drafter
    verifying a smaller drafter) it only changes the *proposal* the target sees; the target's
    own lossless verification, given the proposal's true distribution (:meth:`output`),
    restores p exactly, so the cascade as a whole stays lossless.

    Parameters
    ----------
    leniency : float >= 1 is the paper's use (more acceptance); any l > 0 is valid.
    """

    def __init__(self, leniency: float):
        value = float(as_float_array("leniency", leniency))
        if not (np.isfinite(value) and value > 0):
            raise DraftsimError(f"leniency must be finite and > 0; got {value!r}")
        self.leniency = value

    def acceptance(self, q, p):
        scaled = self.leniency * np.asarray(p)
        return capped_ratio(scaled, q)

    def residual(self, q, p):
        p = np.asarray(p, dtype=np.float64)
        return normalize(np.maximum(0.0, p - q), fallback=p)

    def target(self, q, p):
        return self.output(q, p)

    def greedy_choice(self, q, p):
        return np.asarray(p).argmax(axis=-1)

    def greedy_accept(self, q, p, x):
        """Greedy leniency: keep x when l·p(x) ≥ max p (x = argmax p when l = 1, ties aside)."""
        p = np.asarray(p)
        return self.leniency * _gather(p, x) >= p.max(axis=-1)

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.leniency == 1.0


# ---------------------------------------------------------------- the rule mini-language

_alpha = Param("alpha", ascii_float, required=True)

#: The rule mini-language: one entry per rule (adding a rule is a class plus an entry).
RULES = Registry("rule", base=Rule, entries=[
    Entry("sd", SD, (), (("sd", "lossless speculative sampling (pi = p)"),)),
    Entry("chow", Chow, (_alpha,), (("chow:alpha=0.3", "defer to the target when max q < 1 - alpha      ([SC] eq. 2)"),)),
    Entry("diff", Diff, (_alpha,), (("diff:alpha=0.1", "defer when max q < max p - alpha                ([SC] eq. 5)"),)),
    Entry("opt", OPT, (_alpha,), (("opt:alpha=0.5", "defer when max q < max p - alpha TV(p, q)       ([SC] eq. 10)"),)),
    Entry("token1", TokenV1, (_alpha,), (("token1|token2|token3:alpha=0.2", "token-specific cascades ([SC] eqs. 13-15)"),)),
    Entry("token2", TokenV2, (_alpha,)),
    Entry("token3", TokenV3, (_alpha,)),
    Entry("lossy", Lossy, (_alpha, Param("beta", ascii_float)),
          (("lossy:alpha=0.1[,beta=1]", "lossy speculative sampling                      ([SC] Lemma 3)"),)),
    Entry("bild", BiLD, (_alpha, Param("d", str, "discrepancy")),
          (("bild:alpha=0.3[,d=tv|kl|nll]", "BiLD* deferral on a discrepancy"),)),
    Entry("leniency", Leniency, (Param("l", ascii_float, "leniency", required=True),),
          (("leniency:l=2", "CS Drafting leniency (lossy at the top level)   ([CSD] 3.1)"),)),
])

RULE_HELP = RULES.help


def parse_rule(spec: str) -> Rule:
    """Build a rule from the mini-language (:data:`RULE_HELP`), e.g. ``opt:alpha=0.5``."""
    return RULES.parse(spec)
