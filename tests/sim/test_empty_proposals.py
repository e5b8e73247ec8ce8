"""Proposals that can be empty: a lookup drafter (n-gram, suffix) that finds no match proposes
nothing, and the round is a plain decode step — no draft call, nothing verified, one token."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim import analytic, montecarlo
from draftsim.sim.acceptance import Bernoulli, MarkovModulated, Positional
from draftsim.sim.errors import DraftsimError
from draftsim.sim.policies import FixedK, Threshold


def brute_force(alphas, costs, match):
    """EWIF by summing over every outcome of one round: no proposal (one token, one target
    call), or a proposal whose first rejection is at position n (n = k: all accepted)."""
    k = len(alphas)
    tokens, time = (1 - match) * 1.0, (1 - match) * 1.0
    for n in range(k + 1):
        p = float(np.prod(alphas[:n])) * (1 - alphas[n] if n < k else 1.0)
        tokens += match * p * (n + 1)
        time += match * p * (1 + sum(costs))
    return tokens / time


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5), st.floats(0.0, 0.5), st.floats(0.0, 1.0))
def test_ewif_match_equals_enumeration(alphas, c, match):
    value = analytic.ewif_match(alphas, [c] * len(alphas), match)
    assert value == pytest.approx(brute_force(alphas, [c] * len(alphas), match), rel=1e-9)
    if match == 1.0:
        assert value == pytest.approx(analytic.ewif_positional(alphas, [c] * len(alphas)), rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.floats(0.0, 1.0), st.floats(0.05, 0.95), st.integers(0, 2**31 - 1),
       st.sampled_from(["fixed", "threshold"]), st.sampled_from(["bernoulli", "positional", "markov"]))
def test_rounds_without_a_proposal_cost_no_draft_and_verify_nothing(k, match, alpha, seed, policy_kind, process_kind):
    """Every round: the target's call verifies drafted + 1 tokens, so a round that proposed
    nothing verifies one token and emits one; the drafter is called only in rounds that
    propose; the share of proposing rounds is ``match``."""
    policy = FixedK(k) if policy_kind == "fixed" else Threshold(0.5, k)
    kw = {"match": match, "pred_noise": 0.2}
    process = {"bernoulli": lambda: Bernoulli(alpha, **kw), "positional": lambda: Positional([alpha] * k, **kw),
               "markov": lambda: MarkovModulated([[0.9, 0.1], [0.2, 0.8]], [alpha, alpha / 2], **kw)}[process_kind]()
    r = montecarlo.rounds(policy, process, 64, 200, np.random.default_rng(seed))
    verified = r.call_tokens[:, 0] - 1  # draft tokens the target verified in the round
    assert (r.calls[:, 0] == 1).all()
    empty = verified == 0
    assert (r.calls[empty, 1] == 0).all() and (r.call_tokens[empty, 1] == 0).all()
    assert (r.emitted[empty] <= 1).all()
    assert (r.emitted <= verified + 1).all()
    if match == 0.0:
        assert empty.all()
    if policy_kind == "fixed":
        proposing = ~empty
        assert (verified[proposing] == k).all()
        share = proposing.mean()
        n = len(proposing)
        assert abs(share - match) <= 5 * np.sqrt(max(match * (1 - match), 1e-3) / n) + 1e-9


def test_monte_carlo_agrees_with_the_formula(capsys):
    status, out, _ = run(capsys, "simulate", "--json", "--policy", "fixed:k=3", "--positional", "0.8,0.6,0.4", "--match", "0.3",
                         "--cost", "0.05", "--tokens", "400000", "--seed", "2")
    assert status == 0
    res = json.loads(out)
    expected = analytic.ewif_match([0.8, 0.75, 0.4 / 0.6], [0.05] * 3, 0.3)
    assert res["metrics"]["ewif"]["value"] == pytest.approx(expected, abs=4 * res["metrics"]["ewif"]["se"])


def test_serving_a_lookup_that_never_matches_is_plain_decoding(capsys):
    """With no proposal in any round and a free lookup drafter, speculative serving is step for
    step the autoregressive server: same throughput, latencies and steps."""
    common = ["--target", "llama-3.1-8b", "--drafter-model", "maxgram", "--hardware", "h100-sxm", "--requests", "120", "--qps", "8",
              "--seed", "5"]
    _, ar, _ = run(capsys, "serve-sim", "--json", "--policy", "ar", "--alpha", "0.7", *common)
    status, spec, err = run(capsys, "serve-sim", "--json", "--policy", "fixed:k=4", "--alpha", "0.7", "--match", "0", *common)
    assert status == 0, err
    ar, spec = json.loads(ar), json.loads(spec)
    assert spec["spec_decode"]["num_draft_tokens"] == 0
    for key in ("throughput", "steps"):
        assert spec[key] == ar[key]
    for key in ("ttft", "tpot", "e2e"):
        assert spec[key] == ar[key]


def test_bad_match_is_refused():
    with pytest.raises(DraftsimError, match="match must lie in"):
        Bernoulli(0.5, match=1.2)
