"""Block verification with k = 8 over a 50 000-token vocabulary: time per call, single and batched.

Run: ``.venv/bin/python benchmarks/bench_verify.py``. Rows are softmaxes of Gaussian logits
(LLM-like, no subnormal probabilities); each figure is the best of several repeats, and ratios come from this one run.
"""

from __future__ import annotations

import argparse

import numpy as np
from timing import best_time

from draftsim.sim import rules
from draftsim.sim.distributions import sample
from draftsim.sim.verify import verify_block, verify_block_greedy


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=50_000)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    V, k, B = args.vocab, args.k, args.batch

    def rows(batch: tuple) -> tuple:
        # LLM-like rows: softmax of Gaussian logits (scale 3), the target's correlated with the draft's.
        base = rng.normal(0.0, 3.0, size=batch + (k + 1, V))
        q = softmax(base[..., :k, :] + rng.normal(0.0, 1.0, size=batch + (k, V)))
        return sample(q, rng), q, softmax(base)

    print(f"block verification, k = {k}, V = {V:,}")
    print(f"{'case':44s} {'per call':>12s} {'per sequence':>14s}")
    t1, q1, p1 = rows(())
    singles = [
        ("SD, single, validated", lambda: verify_block(t1, q1, p1, rules.SD(), rng)),
        ("SD, single, validate=False", lambda: verify_block(t1, q1, p1, rules.SD(), rng, validate=False)),
        ("OPT(0.3), single, validate=False", lambda: verify_block(t1, q1, p1, rules.OPT(0.3), rng, validate=False)),
        ("Lossy(0.3), single, validate=False", lambda: verify_block(t1, q1, p1, rules.Lossy(0.3), rng, validate=False)),
        ("greedy, single, validate=False", lambda: verify_block_greedy(t1, p1, validate=False)),
    ]
    for name, fn in singles:
        t = best_time(fn, args.repeat)
        print(f"{name:44s} {t * 1e3:9.3f} ms {t * 1e3:11.3f} ms")
    # Batched cases come second: their large arrays change how later allocations behave.
    tb, qb, pb = rows((B,))
    batched = [
        (f"SD, batch of {B}, validate=False", lambda: verify_block(tb, qb, pb, rules.SD(), rng, validate=False)),
        (f"OPT(0.3), batch of {B}, validate=False", lambda: verify_block(tb, qb, pb, rules.OPT(0.3), rng, validate=False)),
        (f"greedy, batch of {B}, validate=False", lambda: verify_block_greedy(tb, pb, validate=False)),
    ]
    for name, fn in batched:
        t = best_time(fn, args.repeat)
        print(f"{name:44s} {t * 1e3:9.3f} ms {t / B * 1e3:11.3f} ms")


if __name__ == "__main__":
    main()
