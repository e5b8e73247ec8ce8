"""The routed experts of a mixture-of-experts layer, priced for a forward call of N tokens.

Each of the N tokens runs ``k`` of the layer's ``E`` routed experts. A call reads the weights
of every expert that at least one of its tokens chose, once, and computes each token's k
experts. Under uniform, independent routing (each token's k experts a uniform draw of k of E,
tokens independent) an expert is left out by one token with probability 1 − k/E, so the
**expected number of distinct experts** a call wakes is

    E_act(N) = E · (1 − (1 − k/E)^N)

(the occupancy of E bins by N tokens of k balls each, without repetition within a token: an
elementary derivation, property-tested against simulated routing in tests/sim/cost/test_moe.py). This is
why speculation costs more on a MoE target: verifying k+1 tokens per sequence wakes more
experts than decoding one, so the verification's weight reads grow with the draft length where
a dense model's do not. Real routers are skewed, which wakes fewer experts than this (the
uniform case is the most a call can read for its N, in expectation). The layer's time is
max(bytes / bandwidth, FLOPs / peak) over its routed experts, per MoE layer, the shared
experts and the router being dense operators of the roofline.

**Expert parallelism** (``groups`` g > 1: vLLM's ``--enable-expert-parallel`` at data
parallelism 1, where "each device owns a set of experts fully", g = the tensor-parallel size,
with no all-to-all: the tokens are on every device and the MoE's output is all-reduced as under
tensor parallelism; vllm/model_executor/layers/fused_moe/config.py, cited in
docs/research/moe.json). Each device holds G = E/g whole experts and the layer waits for the
busiest device, so a call costs the **expected maximum over the g devices** of what each reads
and computes, not the mean that splitting every expert over the devices gives:

* each expert's tokens are taken as independent Binomial(N, k/E) counts (exact marginals; the
  within-token draws without replacement and the fixed total couple them slightly), and the
  devices as independent, so for X a device's count, E[max over g devices] = Σ_{x≥1} (1 − F(x − 1)^g)
  with F the distribution function of:
* experts awake on a device: Binomial(G, p), p = 1 − (1 − k/E)^N (an expert is awake when its
  count is > 0);
* token-expert pairs on a device: Binomial(N·G, k/E), the sum of its G experts' counts.

Both are property-tested against simulated routing (tests/sim/cost/test_moe.py: within 2% at every
N, for DeepSeek-V3's 256 experts over 8 devices down to Mixtral's 8 over 2). The maxima of the
reads and of the computation are taken apart, an upper bound on the maximum of their sum. What
expert parallelism saves — tensor parallelism's thin slice of every expert, which a roofline of
one MBU and MFU does not see — is not in this model: it prices what expert parallelism costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

__all__ = ["ExpertCost", "expected_experts", "busiest_device_experts", "busiest_device_pairs"]


def expected_experts(n_tokens, experts: int, per_token: int) -> np.ndarray:
    """E · (1 − (1 − k/E)^N): distinct experts N tokens wake under uniform independent routing."""
    n = np.asarray(n_tokens, dtype=np.float64)
    return experts * -np.expm1(n * np.log1p(-per_token / experts)) if per_token < experts else np.where(n > 0, float(experts), 0.0)


def _expected_max_binomial(n: int, q: float, g: int) -> float:
    """E[max of g independent Binomial(n, q)] = Σ_{x=1..n} (1 − F(x − 1)^g), summed over the
    window where F is neither 0 nor 1 (12 standard deviations each side of the mean)."""
    from scipy.special import bdtr  # here: scipy loads only when expert parallelism is priced

    if n <= 0 or q <= 0.0:
        return 0.0
    if q >= 1.0:
        return float(n)
    mean, sd = n * q, np.sqrt(n * q * (1.0 - q))
    lo, hi = max(0, int(np.floor(mean - 12.0 * sd))), min(n, int(np.ceil(mean + 12.0 * sd)) + 1)
    cdf = bdtr(np.arange(lo, hi, dtype=np.float64), n, q)
    return float(lo + np.sum(1.0 - cdf**g))


@lru_cache(maxsize=1 << 16)
def _busiest(n_tokens: int, experts: int, per_token: int, groups: int) -> tuple[float, float]:
    G, q = experts // groups, per_token / experts
    p = float(expected_experts(n_tokens, experts, per_token)) / experts
    return _expected_max_binomial(G, p, groups), _expected_max_binomial(n_tokens * G, q, groups)


def _per_call(n_tokens, experts: int, per_token: int, groups: int, which: int) -> np.ndarray:
    n = np.asarray(n_tokens, dtype=np.float64)
    flat = np.rint(n).astype(np.int64).ravel()
    uniq, inverse = np.unique(flat, return_inverse=True)
    values = np.array([_busiest(int(u), experts, per_token, groups)[which] for u in uniq], dtype=np.float64)
    return values[inverse].reshape(n.shape)


def busiest_device_experts(n_tokens, experts: int, per_token: int, groups: int) -> np.ndarray:
    """Expected awake experts on the busiest of ``groups`` devices, each holding experts/groups
    whole experts, for calls of N tokens (module docstring)."""
    return _per_call(n_tokens, experts, per_token, groups, 0)


def busiest_device_pairs(n_tokens, experts: int, per_token: int, groups: int) -> np.ndarray:
    """Expected token-expert pairs on the busiest of ``groups`` devices (module docstring)."""
    return _per_call(n_tokens, experts, per_token, groups, 1)


@dataclass(frozen=True)
class ExpertCost:
    """The routed experts of ``layers`` MoE layers on one device: ``weight_bytes`` and
    ``flops_per_token`` of one expert (its share on this device), ``act_bytes`` of activations
    per token per expert it runs. ``groups`` > 1: expert parallelism over that many devices,
    each holding whole experts (then the shares are whole experts' and a call costs the busiest
    device's; module docstring). ``fixed``: seconds of one layer's fused-MoE call beyond its bytes and
    FLOPs (the catalog's ``fused_moe_us``, :class:`~draftsim.sim.cost.catalog.HardwareSpec`), added to
    every layer of a call of at least one token. ``measured``: one layer's measured seconds for calls of N
    tokens (:class:`~draftsim.sim.cost.moe_tables.MeasuredExperts`, the fused-MoE kernel at the rows each
    awake expert receives), which :meth:`seconds` then prices in place of the roofline (``fixed`` unused)."""

    layers: int
    experts: int
    per_token: int
    weight_bytes: float
    act_bytes: float
    flops_per_token: float
    groups: int = 1
    measured: Callable | None = None
    fixed: float = 0.0

    def _pairs(self, n: np.ndarray) -> np.ndarray:
        if self.groups == 1:
            return n * self.per_token
        return busiest_device_pairs(n, self.experts, self.per_token, self.groups)

    def bytes(self, n_tokens) -> np.ndarray:
        n = np.asarray(n_tokens, dtype=np.float64)
        awake = (expected_experts(n, self.experts, self.per_token) if self.groups == 1 else
                 busiest_device_experts(n, self.experts, self.per_token, self.groups))
        return self.layers * (awake * self.weight_bytes + self._pairs(n) * self.act_bytes)

    def flops(self, n_tokens) -> np.ndarray:
        return self.layers * self._pairs(np.asarray(n_tokens, dtype=np.float64)) * self.flops_per_token

    def fixed_seconds(self, n_tokens) -> np.ndarray | float:
        """``fixed`` per layer, summed over the layers, for calls of N > 0 tokens (0 for N = 0)."""
        if not self.fixed:
            return 0.0
        return np.where(np.asarray(n_tokens, dtype=np.float64) > 0, self.layers * self.fixed, 0.0)

    def seconds(self, n_tokens, bandwidth: float, peak: float) -> np.ndarray:
        """max(bytes / bandwidth, FLOPs / peak) per layer plus ``fixed``, summed over the layers; with
        ``measured`` the layers' measured time instead."""
        if self.measured is not None:
            return self.layers * np.asarray(self.measured(np.asarray(n_tokens, dtype=np.float64)), dtype=np.float64)
        return np.maximum(self.bytes(n_tokens) / bandwidth, self.flops(n_tokens) / peak) + self.fixed_seconds(n_tokens)
