"""Hypothesis strategies and helpers shared by the verification tests: toy models and rows."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from sim.exact import TableModel


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
