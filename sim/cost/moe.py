"""The routed experts of a mixture-of-experts layer, priced for a forward call of N tokens.

Each of the N tokens runs ``k`` of the layer's ``E`` routed experts. A call reads the weights
of every expert that at least one of its tokens chose, once, and computes each token's k
experts. Under uniform, independent routing (each token's k experts a uniform draw of k of E,
tokens independent) an expert is left out by one token with probability 1 − k/E, so the
**expected number of distinct experts** a call wakes is

    E_act(N) = E · (1 − (1 − k/E)^N)

(the occupancy of E bins by N tokens of k balls each, without repetition within a token: an
elementary derivation, property-tested against simulated routing in tests/test_cost_moe.py). This is
why speculation costs more on a MoE target: verifying k+1 tokens per sequence wakes more
experts than decoding one, so the verification's weight reads grow with the draft length where
a dense model's do not. Real routers are skewed, which wakes fewer experts than this (the
uniform case is the most a call can read for its N, in expectation). The layer's time is
max(bytes / bandwidth, FLOPs / peak) over its routed experts, per MoE layer, the shared
experts and the router being dense operators of the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ExpertCost", "expected_experts"]


def expected_experts(n_tokens, experts: int, per_token: int) -> np.ndarray:
    """E · (1 − (1 − k/E)^N): distinct experts N tokens wake under uniform independent routing."""
    n = np.asarray(n_tokens, dtype=np.float64)
    return experts * -np.expm1(n * np.log1p(-per_token / experts)) if per_token < experts else np.where(n > 0, float(experts), 0.0)


@dataclass(frozen=True)
class ExpertCost:
    """The routed experts of ``layers`` MoE layers on one device: ``weight_bytes`` and
    ``flops_per_token`` of one expert (its share on this device), ``act_bytes`` of activations
    per token per expert it runs."""

    layers: int
    experts: int
    per_token: int
    weight_bytes: float
    act_bytes: float
    flops_per_token: float

    def bytes(self, n_tokens) -> np.ndarray:
        n = np.asarray(n_tokens, dtype=np.float64)
        return self.layers * (expected_experts(n, self.experts, self.per_token) * self.weight_bytes + n * self.per_token * self.act_bytes)

    def flops(self, n_tokens) -> np.ndarray:
        return self.layers * np.asarray(n_tokens, dtype=np.float64) * self.per_token * self.flops_per_token

    def seconds(self, n_tokens, bandwidth: float, peak: float) -> np.ndarray:
        """max(bytes / bandwidth, FLOPs / peak) per layer, summed over the layers."""
        return np.maximum(self.bytes(n_tokens) / bandwidth, self.flops(n_tokens) / peak)
