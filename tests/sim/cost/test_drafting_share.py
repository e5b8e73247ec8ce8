"""The drafting share of a speculative step against batch, checked against SpecDecode-Bench's
measured time breakdown (its Figure 4: vLLM v0.10.1 on one H100, the bars read by eye into
docs/research/overheads.json, entry ``specdecode-bench-fig4-time-breakdown``).

The share is the drafter's three calls over them plus the target's verification of four tokens, at
an assumed 1,024 cached tokens a sequence (the figure states neither k nor the contexts). The
source shows every drafting share falling with batch: heads (EAGLE, EAGLE-3) and a small draft
model alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from draftsim.sim.cost.assembly import Deployment, assemble

FIG4 = next(e for e in json.loads((Path(__file__).resolve().parents[3] / "docs" / "research" / "overheads.json").read_text())["entries"]
            if e["id"] == "specdecode-bench-fig4-time-breakdown")["read_from_figure_approx"]
BATCHES = (1, 64, 128, 512)


def _shares(target: str, drafter: str) -> np.ndarray:
    a = assemble(Deployment(target, "h100-sxm", (drafter,)))
    out = []
    for b in BATCHES:
        verify = float(a.target.shape_time(b, 4, 1024))
        draft = 3 * float(a.drafters[0].shape_time(b, 1, 1024))
        out.append(draft / (draft + verify))
    return np.array(out)


@pytest.mark.parametrize("drafter,figure", [("eagle", "Llama3.1-8B EAGLE drafting share"), ("eagle3", "Llama3.1-8B EAGLE-3 drafting share")])
def test_a_heads_drafting_share_falls_with_batch_as_measured(drafter, figure):
    """Llama-3.1-8B's EAGLE and EAGLE-3 heads: the share falls from batch 1 to 512 as the figure's does,
    and lies within 8 points of each bar read (roofline with the vllm engine, the default)."""
    got = _shares("llama-3.1-8b", drafter)
    measured = np.array([FIG4[figure][str(b)] for b in BATCHES])
    assert np.all(np.diff(got) < 0) and np.all(np.diff(measured) < 0)
    assert np.max(np.abs(got - measured)) < 0.08, (got, measured)


@pytest.mark.xfail(strict=True, reason=(
    "misses: SpecDecode-Bench's Figure 4c measures the draft model's share of Qwen3-8B's steps falling with batch "
    "(0.47, 0.25, 0.21, 0.16 at batch 1, 64, 128, 512); draftsim's rises (roofline 0.40, 0.42, 0.43, 0.44 at 1,024 cached "
    "tokens). Qwen3-0.6B caches 112 KiB a token against Qwen3-8B's 144 KiB (28 layers x 8 KV heads x 128 against 36), so "
    "at batch x context its three draft calls read almost as much KV as the verification: priced that way the draft "
    "share must rise. The bars come from the benchmark's own vLLM fork (branch perf/tb-dm, PR 24322's draft-model "
    "proposer; vLLM 0.10.x itself ran no separate draft model), k = 3 as stated, as whole-run fractions with prefills and "
    "overhead in; the contexts are not stated. The draft reads its full context from the target's KV pool, as priced. "
    "No sourced mechanism found (docs/research/draft-model-share.md); not tuned"))
def test_a_small_draft_models_share_falls_with_batch_as_measured():
    got = _shares("qwen3-8b", "qwen3-0.6b")
    measured = np.array([FIG4["Qwen3-8B draft-model drafting share"][str(b)] for b in BATCHES])
    assert np.all(np.diff(got) < 0), (got, measured)
