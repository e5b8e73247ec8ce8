"""Hypothesis strategies and helpers shared by the verification tests: toy models and rows."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from draftsim.sim.exact import TableModel


@st.composite
def rows(draw, vocab: int | None = None, zeros: bool = True):
    """A probability row over a small vocabulary, sometimes with exact zeros and ties."""
    v = vocab if vocab is not None else draw(st.integers(2, 6))
    weights = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=v, max_size=v)))
    if not zeros:
        weights = weights + 0.05
    if draw(st.booleans()):  # coarse weights make ties and exact zeros common
        weights = np.round(weights * 4) / 4
    if weights.sum() <= 0:
        weights[draw(st.integers(0, v - 1))] = 1.0
    return weights / weights.sum()


@st.composite
def row_pairs(draw, zeros: bool = True):
    """(q, p) over the same vocabulary, with q > 0 somewhere."""
    v = draw(st.integers(2, 6))
    return draw(rows(v, zeros)), draw(rows(v, zeros))


@st.composite
def models(draw, n_models: int = 2, max_vocab: int = 5):
    """``n_models`` seeded TableModels over one vocabulary (some rows with zeros)."""
    vocab = draw(st.integers(2, max_vocab))
    out = []
    for _ in range(n_models):
        out.append(
            TableModel(
                vocab,
                seed=draw(st.integers(0, 2**31 - 1)),
                concentration=draw(st.sampled_from([0.3, 1.0, 3.0])),
                zeros=draw(st.sampled_from([0.0, 0.0, 0.34])),
            )
        )
    return out


def write_hand_trace(path) -> None:
    """A hand-written recording: drafter ``d`` against the target along two sequences,
    greedy-match flags 1,1,0,1,1,0 (sequence 0) and 0,1,1,1 (sequence 1)."""
    from draftsim.sim.traces import TraceWriter

    w = TraceWriter(path, {"target": {"name": "hand"}, "drafters": ["d"], "prompt_set": "x", "max_new_tokens": 6,
                           "top_k": 1, "modes": ["greedy"], "seed": None})
    for pid, flags in ((0, [1, 1, 0, 1, 1, 0]), (1, [0, 1, 1, 1])):
        n = len(flags)
        w.commit(f"x/{pid}/greedy", {"prompt_id": pid}, {
            "sequences": {"prompt_set": ["x"], "prompt_id": [pid], "split": ["test"], "mode": ["greedy"], "seed": [-1],
                          "prompt_ids": [[1, 2]], "output_ids": [list(range(n))]},
            "positions": {"prompt_id": [pid] * n, "mode": ["greedy"] * n, "position": list(range(n)), "target_token": list(range(n)),
                          "proposer": ["d"] * n, "verifier": ["target"] * n, "draft_token": list(range(n)), "p_draft": [1.0] * n,
                          "q_draft": [1.0] * n, "accept_prob": [float(f) for f in flags], "greedy_match": [bool(f) for f in flags],
                          "draft_top_ids": [[0]] * n, "draft_top_probs": [[1.0]] * n, "verifier_top_ids": [[0]] * n, "verifier_top_probs": [[1.0]] * n},
            "calls": {"prompt_id": [pid], "mode": ["greedy"], "model": ["target"], "kind": ["forward"], "n_tokens": [n], "seconds": [0.1]},
        })


def chi_square_pvalue(counts: dict, exact: dict) -> float:
    """p-value of the chi-square test of sampled outcome ``counts`` against the ``exact``
    distribution (outcome -> probability): cells expected fewer than 5 times pooled into one."""
    from scipy import stats

    n = sum(counts.values())
    keys = sorted(exact)
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    exp = np.array([exact[k] for k in keys]) * n
    keep = exp >= 5
    obs, exp = np.append(obs[keep], obs[~keep].sum()), np.append(exp[keep], exp[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
