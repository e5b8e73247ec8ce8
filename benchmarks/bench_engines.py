"""Simulated tokens per second: Monte Carlo, DES (1 and 64 requests) and a naive per-token loop.

Run: ``.venv/bin/python benchmarks/bench_engines.py``. FixedK(k=5) under Bernoulli(0.8),
drafter cost 0.05. All figures come from this one run; ratios are against the naive loop.
Goals (issue 4): Monte Carlo >= 5e7 tokens/s on one core; DES >= 5e5 tokens/s with one
request and >= 1e5 tokens/s with 64 concurrent requests.
"""

from __future__ import annotations

import argparse
import random
import time

from draftsim.sim import acceptance as A
from draftsim.sim import policies as P
from draftsim.sim.simulate import simulate


def naive_loop(n_tokens: int, alpha: float, k: int, c: float, seed: int) -> float:
    """Speculative decoding simulated token by token in plain Python; returns EWIF."""
    rnd = random.Random(seed)
    tokens = calls = draft_calls = 0
    while tokens < n_tokens:
        accepted = 0
        for _ in range(k):  # draft k tokens, verify one by one
            draft_calls += 1
        for _ in range(k):
            if rnd.random() < alpha:
                accepted += 1
            else:
                break
        calls += 1
        tokens += accepted + 1
    return tokens / (calls + c * draft_calls)


def rate(fn, n_tokens: int, repeat: int = 1) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return n_tokens / best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mc-tokens", type=int, default=50_000_000)
    parser.add_argument("--des-tokens", type=int, default=1_000_000)
    parser.add_argument("--naive-tokens", type=int, default=1_000_000)
    args = parser.parse_args()
    policy, process, cost = P.FixedK(5), A.Bernoulli(0.8), 0.05

    naive, ewif_naive = rate(lambda: naive_loop(args.naive_tokens, 0.8, 5, cost, 0), args.naive_tokens)
    mc, r_mc = rate(lambda: simulate(policy, process, cost, args.mc_tokens, seed=0), args.mc_tokens, repeat=3)
    des1, r_d1 = rate(lambda: simulate(policy, process, cost, args.des_tokens, engine="des", seed=0), args.des_tokens, repeat=2)
    des64, r_d64 = rate(lambda: simulate(policy, process, cost, args.des_tokens, engine="des", requests=64, seed=0), args.des_tokens, repeat=2)

    print("FixedK(k=5), Bernoulli(0.8), c = 0.05 (analytic EWIF 2.9514)")
    print(f"{'engine':28s} {'tokens/s':>12s} {'vs naive':>9s} {'EWIF':>8s}  goal")
    print(f"{'naive per-token loop':28s} {naive:12.3g} {1.0:8.1f}x {ewif_naive:8.4f}")
    print(f"{'Monte Carlo':28s} {mc:12.3g} {mc / naive:8.1f}x {r_mc.metrics['ewif'].value:8.4f}  >= 5e7")
    print(f"{'DES, 1 request':28s} {des1:12.3g} {des1 / naive:8.1f}x {r_d1.metrics['ewif'].value:8.4f}  >= 5e5")
    print(f"{'DES, 64 requests':28s} {des64:12.3g} {des64 / naive:8.1f}x {r_d64.metrics['ewif'].value:8.4f}  >= 1e5")


if __name__ == "__main__":
    main()
