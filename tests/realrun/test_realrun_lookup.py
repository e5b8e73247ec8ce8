"""Lookup drafting on the real side: vLLM's ``ngram`` (prompt lookup) and suffix decoding.

The drafters against brute-force references (hypothesis); losslessness with a deterministic
(one-hot) draft by exact enumeration on a three-token vocabulary, with a broken verifier as the
mutation control; on tiny models: greedy output identical to the target's, sampling following
the target's exact distribution, empty proposals recorded (drafted 0) in run traces and
recorded traces, which replay."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toy import chi_square_pvalue

from draftsim.realrun.drafters import NGram, Rows, Suffix, accept_prob
from draftsim.sim.errors import DraftsimError
from draftsim.sim.exact import TableModel, autoregressive, max_abs_difference
from draftsim.sim.rules import SD

texts = st.lists(st.integers(0, 3), min_size=1, max_size=40)


# ---------------------------------------------------------------- the drafters against references


def ngram_reference(ctx: list[int], k: int, lo: int, hi: int) -> list[int]:
    """vLLM's rule written out: for n from hi down to lo, the earliest earlier occurrence
    (ending before the context does) of the context's last n tokens; the k tokens after it."""
    L = len(ctx)
    for n in range(min(hi, L - 1), lo - 1, -1):
        for start in range(0, L - n):  # occurrence ctx[start:start+n], ends at start+n <= L-1
            if ctx[start : start + n] == ctx[L - n :]:
                j = start + n
                return ctx[j : min(j + k, L)]
    return []


@given(texts, st.integers(1, 6), st.integers(1, 3), st.integers(0, 3))
def test_ngram_proposes_what_follows_the_earliest_longest_match(ctx, k, lo, extra):
    hi = lo + extra
    drafter = NGram(8, lo, hi)
    tokens, rows = drafter.propose(ctx, k)
    assert tokens == ngram_reference(ctx, k, lo, hi)
    assert len(rows) == len(tokens) <= k and list(rows.argmax()) == tokens
    if tokens:
        assert np.all(rows.prob(tokens) == 1.0)  # one-hot: a deterministic draft


def test_ngram_follows_vllms_documented_example():
    # vLLM's NgramProposer docstring: [1,2,3,4,2,3], min 2, max 3, k 4 -> [4, 2, 3].
    assert NGram(8, 2, 3).propose([1, 2, 3, 4, 2, 3], 4)[0] == [4, 2, 3]
    assert NGram(8, 2, 3).propose([1, 2, 3, 4, 5], 4)[0] == []  # no match: nothing
    assert NGram(8, 3, 3).propose([1, 2, 3, 4, 2, 3], 4)[0] == []  # only a 2-gram matches
    with pytest.raises(DraftsimError, match="prompt_lookup_min"):
        NGram(8, 3, 2)


def occurs(text: list[int], pattern: list[int], before: int | None = None) -> int:
    """How many times ``pattern`` occurs in ``text`` (ending at or before ``before``)."""
    end = len(text) if before is None else before
    return sum(text[i : i + len(pattern)] == pattern for i in range(0, end - len(pattern) + 1))


@given(texts, st.lists(texts, max_size=3), st.integers(1, 6), st.sampled_from([0.0, 0.1, 0.5]), st.sampled_from([0.5, 1.0, 2.0]))
@settings(max_examples=200)
def test_suffix_proposals_are_frequent_continuations_of_a_matched_pattern(ctx, earlier, k, min_prob, factor):
    """Every proposal continues a pattern (the context's last m tokens) in one source — the
    context itself (occurrences ending before its end) or the earlier outputs (pooled) — and is
    at most min(k, factor·m) long; its confidences are the path's probability: non-increasing,
    at least min_prob, each step's ratio the continuation's count over the pattern's."""
    drafter = Suffix(8, max_depth=24, spec_factor=factor, min_prob=min_prob)
    for out in earlier:
        drafter.finish([0], out)
    tokens, rows = drafter.propose(ctx, k)
    assert len(tokens) == len(rows) <= k
    if not tokens:
        return
    conf = rows.conf
    assert np.all(np.diff(conf) <= 1e-12) and conf[-1] >= min_prob - 1e-12 and conf[0] <= 1.0
    L = len(ctx)
    sources = [[ctx]] + ([earlier] if earlier else [])
    found = False
    for m in range(1, L + 1):
        if len(tokens) > int(factor * m + 1e-6):
            continue
        pattern = ctx[L - m :]
        for src in sources:
            # In the context itself only occurrences that end before the context does count.
            before = (lambda t: L - 1) if src[0] is ctx and len(src) == 1 else (lambda t: None)
            counts = [sum(occurs(t, pattern + tokens[:i], before(t) if i == 0 else (L if t is ctx else None)) for t in src)
                      for i in range(len(tokens) + 1)]
            if counts[0] and all(c > 0 for c in counts):
                ratios = np.cumprod([counts[i + 1] / counts[i] for i in range(len(tokens))])
                if np.allclose(ratios, conf):
                    found = True
    assert found, (ctx, earlier, tokens, conf)


def test_suffix_examples_and_the_global_cache():
    d = Suffix(16)
    assert d.propose([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], 4)[0] == [3, 4, 1, 2]
    assert d.propose([5, 6, 7], 4)[0] == []  # nothing repeats, nothing cached
    d.finish([0], [9, 6, 7, 8, 10])  # an earlier request's output
    tokens, rows = d.propose([5, 6, 7], 4)
    assert tokens == [8, 10] and list(rows.conf) == [1.0, 1.0]  # "6 7" was followed by "8 10"
    low = Suffix(16, min_prob=0.6)
    # "1" was followed by 2, 3 and 2: 2 with probability 2/3 (and "7 1" never occurred)
    tokens, rows = low.propose([1, 2, 5, 1, 3, 6, 1, 2, 7, 1], 3)
    assert tokens == [2] and rows.conf[0] == pytest.approx(2 / 3)
    assert Suffix(16, min_prob=0.7).propose([1, 2, 5, 1, 3, 6, 1, 2, 7, 1], 3)[0] == []
    assert Suffix(16, max_cached=0).finish([0], [1, 2]) is None
    with pytest.raises(DraftsimError, match="max_depth"):
        Suffix(16, max_depth=1)


def test_empty_rows_accept_nothing():
    """A position where the lookup proposes nothing: draft −1, probability 0, acceptance 0."""
    rows = NGram(4, 2, 2).predict_along([0, 1, 2, 3, 0, 1, 0, 1], 4)
    assert list(rows.argmax()) == [-1, -1, 2, -1]  # only "0 1" recurs: 2 followed it
    p = np.full((4, 4), 0.25)
    assert list(accept_prob(p, rows)) == [0.0, 0.0, 0.25, 0.0]
    assert isinstance(rows, Rows) and rows.prob([-1, -1, 2, -1]).tolist() == [0.0, 0.0, 1.0, 0.0]


# ---------------------------------------------------------------- losslessness by exact enumeration


class LookupProcess:
    """Speculative sampling with a lookup drafter: per round the drafter proposes up to k
    tokens from the context (deterministic, possibly none); each is verified against the
    target's row with the rule's acceptance of a one-hot q; a rejection emits from the residual,
    a fully accepted proposal the target's bonus token. Enumerated exactly."""

    def __init__(self, target, drafter, k: int, rule=SD()):
        self.target, self.drafter, self.k, self.rule = target, drafter, k, rule

    def one_hot(self, x: int) -> np.ndarray:
        q = np.zeros(self.target.vocab)
        q[x] = 1.0
        return q

    def accept(self, q, p, x):
        return float(self.rule.acceptance(q, p)[x])

    def residual(self, q, p):
        return self.rule.residual(q, p)

    def round(self, context):
        draft = self.drafter.propose(list(context), self.k)[0]
        out = []

        def walk(i, ctx, emitted, prob):
            p = self.target(ctx)
            if i == len(draft):
                out.extend((emitted + (y,), prob * py) for y, py in enumerate(p))
                return
            x = draft[i]
            q = self.one_hot(x)
            a = self.accept(q, p, x)
            if a < 1:
                out.extend((emitted + (z,), prob * (1 - a) * rz) for z, rz in enumerate(self.residual(q, p)))
            if a > 0:
                walk(i + 1, ctx + (x,), emitted + (x,), prob * a)

        walk(0, tuple(context), (), 1.0)
        return out

    def distribution(self, n: int, prefix=()):
        dist = defaultdict(float)

        def go(generated, prob):
            if len(generated) >= n:
                dist[generated[:n]] += prob
                return
            for emitted, pr in self.round(tuple(prefix) + generated):
                if pr > 0:
                    go(generated + emitted, prob * pr)

        go((), 1.0)
        return dict(dist)


class AcceptsEveryLookup(LookupProcess):
    """Mutation control: takes a proposed token whenever the target could emit it at all."""

    def accept(self, q, p, x):
        return 1.0 if p[x] > 0 else 0.0


LOOKUPS = [lambda: NGram(3, 1, 3), lambda: NGram(3, 2, 2), lambda: Suffix(3, min_prob=0.0), lambda: Suffix(3)]


@given(st.integers(0, 10_000), st.sampled_from(range(len(LOOKUPS))), st.integers(1, 3),
       st.lists(st.integers(0, 2), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None)
def test_lookup_drafting_keeps_the_targets_distribution_exactly(seed, which, k, prefix):
    target = TableModel(3, seed=seed, concentration=0.7, zeros=0.3)
    process = LookupProcess(target, LOOKUPS[which](), k)
    got = process.distribution(3, tuple(prefix))
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    assert max_abs_difference(got, autoregressive(target, 3, tuple(prefix))) < 1e-12


def test_the_exact_check_catches_a_verifier_that_accepts_every_lookup():
    target = TableModel(3, seed=7, concentration=0.7)
    prefix = (0, 1, 0, 1, 0)
    for process in (AcceptsEveryLookup(target, NGram(3, 1, 3), 2), AcceptsEveryLookup(target, Suffix(3, min_prob=0.0), 2)):
        assert max_abs_difference(process.distribution(3, prefix), autoregressive(target, 3, prefix)) > 1e-2


# ---------------------------------------------------------------- on tiny models: the executor, traces, replay

REPEATING = "ab ab ab cd ab cd ab ab cd"


@pytest.fixture(scope="module")
def target():
    from draftsim.realrun.models import load_model

    return load_model("tiny:1")


def own_greedy(target, prompt, n):
    """The target's own greedy continuation past EOS: the autoregressive executor (which
    test_executor holds to transformers' generate)."""
    from draftsim.realrun.executor import generate

    return generate(target, prompt, n, stop_at_eos=False).output


@pytest.mark.parametrize("make", [lambda v: NGram(v, 1, 3), lambda v: NGram(v), lambda v: Suffix(v)], ids=["ngram1-3", "ngram2-4", "suffix"])
@pytest.mark.parametrize("policy", ["fixed:k=1", "fixed:k=4", "confidence:tau=0.5,kmax=6"])
def test_greedy_lookup_reproduces_the_target_and_logs_empty_proposals(target, make, policy):
    from draftsim.realrun.executor import generate
    from draftsim.sim.policies import parse_policy

    prompt = target.tokenizer(REPEATING)["input_ids"]
    drafter = make(target.vocab_size)
    log = generate(target, prompt, 30, parse_policy(policy), drafter, stop_at_eos=False)
    assert log.output == own_greedy(target, prompt, 30)
    drafted = [r.drafted for r in log.rounds]
    assert 0 in drafted and max(drafted) > 0  # some rounds proposed nothing, some proposed
    # One draft event per proposed token, none for an empty proposal; the round's count says so.
    per_round = defaultdict(int)
    for d in log.drafts:
        per_round[d.round] += 1
    assert all(per_round[r.round] >= r.drafted for r in log.rounds)
    assert all(per_round[r.round] == 0 for r in log.rounds if r.drafted == 0 and r.start + 1 < log.tokens)
    assert log.target_calls == len(log.rounds) and log.tokens == sum(r.emitted for r in log.rounds)


def test_run_traces_with_empty_proposals_replay(tmp_path, target):
    """A run trace of n-gram drafting keeps its empty rounds (drafted 0) and replays in the
    simulator with the lengths it proposed: the same counts — tokens, target calls, drafted
    and accepted."""
    from draftsim.analysis.reality import check_run, held_to_sim
    from draftsim.realrun.compare import measure
    from draftsim.realrun.methods import method_from
    from draftsim.realrun.prompts import prompt_set
    from draftsim.sim.traces import RunTrace

    m = method_from("sd", target, "ngram", "fixed:k=3")
    out = held_to_sim(measure(target, m, prompt_set("extract", "test", 2) + prompt_set("edit", "test", 1), 24, trace_dir=tmp_path / "run"))
    trace = RunTrace(tmp_path / "run")
    drafted = trace.rounds["drafted"].to_pylist()
    assert 0 in drafted and sum(drafted) == sum(lv["drafted"] for lv in out["levels"]) > 0
    assert out["quality"]["identical_to_target"] == 1.0
    check = check_run(trace)
    assert check["replayable"] and check["sim"]["tokens"] == check["real"]["tokens"]
    assert check["sim"]["target_calls"] == check["real"]["target_calls"]
    assert check["sim"]["accepted"] == check["real"]["accepted"]
    assert check["counts_equal"], (check["sim"], check["real"])


def test_sampling_with_lookup_follows_the_targets_exact_distribution(target):
    """Two tokens sampled (temperature 1, top-k 4) through n-gram and suffix drafts on a
    repeating prompt: chi-square against the target's exact two-token distribution."""
    import torch

    from draftsim.realrun.executor import Sampling, generate
    from draftsim.sim.distributions import warp
    from draftsim.sim.policies import FixedK

    prompt = target.tokenizer("ab ab a")["input_ids"]

    def row(ids):
        with torch.inference_mode():
            return warp(torch.softmax(target.model(torch.tensor([ids])).logits[0, -1].double(), -1).numpy(), 1.0, 4)

    first = row(prompt)
    exact = {(int(x), int(y)): first[x] * py for x in np.flatnonzero(first > 0) for y, py in enumerate(row(prompt + [int(x)])) if py > 0}
    for drafter in (NGram(target.vocab_size, 1, 3), Suffix(target.vocab_size, min_prob=0.0)):
        rng = np.random.default_rng(1)
        counts: dict = {}
        n, proposed = 1500, 0
        for _ in range(n):
            log = generate(target, prompt, 2, FixedK(2), drafter, sampling=Sampling(1.0, 4), rng=rng, stop_at_eos=False)
            counts[tuple(log.output)] = counts.get(tuple(log.output), 0) + 1
            proposed += log.drafted
        assert proposed > n // 2  # the drafts were exercised
        assert set(counts) <= set(exact)
        assert chi_square_pvalue(counts, exact) > 1e-3, drafter.name


def test_record_and_replay_a_lookup_drafter(tmp_path, target, capsys):
    """``draftsim record --drafter ngram`` marks positions without a proposal (draft −1, never
    accepted) and ``draftsim replay`` of that trace runs; ``draftsim run --drafter suffix`` too."""
    import json

    from draftsim.cli import main
    from draftsim.sim.traces import Trace

    assert main(["record", "--model", "tiny:1", "--drafter", "ngram", "--drafter", "suffix", "--prompts", "extract", "--n", "2",
                 "--max-new-tokens", "16", "--out", str(tmp_path / "rec")]) == 0
    pos = Trace(tmp_path / "rec").positions.to_pydict()
    none = [i for i, t in enumerate(pos["draft_token"]) if t == -1]
    assert none and all(pos["accept_prob"][i] == 0.0 and not pos["greedy_match"][i] for i in none)
    assert {pos["proposer"][i] for i in none} <= {"ngram", "suffix"}
    capsys.readouterr()
    for name in ("ngram", "suffix"):
        assert main(["replay", "--trace", str(tmp_path / "rec"), "--drafter", name, "--policy", "fixed:k=3", "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["drafters"] == [name] and data["oracle"]["n_tokens"] > 0
    assert main(["run", "--model", "tiny:1", "--method", "sd", "--drafter", "suffix", "--prompts", "extract", "--n", "1",
                 "--max-new-tokens", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quality"]["identical_to_target"] == 1.0


@pytest.mark.parametrize("name,k", [("ngram", 3), ("suffix", 4)])
def test_the_planners_rounds_are_the_runs_rounds(target, name, k):
    """Walking a lookup drafter along the target's greedy text gives exactly the rounds the
    executor makes (proposed, accepted, emitted), EOS and budget included — what lets the
    planner predict a run from a pilot text."""
    from draftsim.analysis.lookup import lookup_rounds
    from draftsim.realrun.executor import generate
    from draftsim.realrun.methods import make_drafter
    from draftsim.sim.policies import FixedK

    for text, budget in ((REPEATING, 30), ("ab ab", 7), ("cd cd cd cd", 40)):
        prompt = target.tokenizer(text)["input_ids"]
        own = generate(target, prompt, budget).output
        log = generate(target, prompt, budget, FixedK(k), make_drafter(name, target))
        assert log.output == own
        rounds, seconds = lookup_rounds(make_drafter(name, target), prompt, own, k)
        assert rounds == [(r.drafted, r.accepted, r.emitted) for r in log.rounds] and seconds >= 0


def test_plan_lookup_ranks_choices_by_predicted_speedup(target):
    from draftsim.analysis.lookup import plan_lookup, price_rounds, run_pilot, why
    from draftsim.realrun.prompts import prompt_set

    pilot = run_pilot(target, prompt_set("edit", "train", 2), 16, 3, repeats=2)
    assert len(pilot.verify) == 4 and all(v > 0 for v in pilot.verify) and len(pilot.texts) == 2
    plan = plan_lookup(target, pilot, ks=(1, 3))
    speeds = [c.speedup for c in plan.choices]
    assert speeds == sorted(speeds, reverse=True) and {(c.drafter, c.k) for c in plan.choices} == {(d, k) for d in ("ngram", "suffix") for k in (1, 3)}
    for c in plan.choices:
        assert c.tokens == sum(map(len, pilot.texts)) and c.accepted <= c.proposed
        assert c.autoregressive_seconds == pytest.approx(pilot.prefill + pilot.step(0) * c.tokens)
    assert price_rounds(pilot, [(0, 0, 1)] * 3) == pytest.approx(3 * pilot.step(0))
    with pytest.raises(DraftsimError, match="covers drafts of up to 3"):
        pilot.step(4)
    lines = why({"target_calls": 10, "mean_accepted_length": 1.1, "speedup": 0.9, "proposing_rounds": 2}, 1.2, plan.best, pilot)
    assert any("does not pay" in line for line in lines)


def test_bad_drafter_names_get_one_line(capsys):
    from draftsim.cli import main

    assert main(["run", "--model", "tiny:1", "--method", "sd", "--drafter", "ngrm", "--n", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'ngrm'" in err and "ngram, suffix" in err and "Traceback" not in err
    assert main(["run", "--model", "tiny:1", "--prompts", "edits"]) == 2
    assert "edit, extract" in capsys.readouterr().err


# ---------------------------------------------------------------- controlled acceptance (issue 28)

def test_the_controlled_drafter_keeps_each_position_at_its_rate():
    """Proposals along a recorded continuation: the kept prefix (what a greedy verification
    accepts) has P(length >= j) = rates[0] * ... * rates[j-1] (the last rate repeating)."""
    from draftsim.realrun.drafters import Controlled

    ref = list(range(100, 400))
    d = Controlled(50_000, [0.9, 0.6], seed=3)
    d.prepare([1, 2, 3], ref)
    n, k = 20_000, 4
    lengths = np.zeros(n, dtype=int)
    for i in range(n):
        at = i % 200
        tokens, rows = d.propose([1, 2, 3] + ref[:at], k, prompt_len=3)
        assert len(tokens) == k and len(rows) == k
        lengths[i] = next((j for j, (t, r) in enumerate(zip(tokens, ref[at:])) if t != r), k)
    want = np.cumprod([0.9, 0.6, 0.6, 0.6])
    got = [(lengths >= j).mean() for j in range(1, k + 1)]
    assert np.allclose(got, want, atol=4 * np.sqrt(want * (1 - want) / n) + 1e-3), (got, want)


def test_controlled_drafting_on_real_models_is_lossless_and_counted(capsys):
    from draftsim.cli import main

    assert main(["run", "--target", "tiny:1", "--method", "sd", "--drafter", "controlled:0.8@tiny:2", "--policy", "fixed:k=3",
                 "--prompts", "code", "--n", "2", "--max-new-tokens", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["quality"]["identical_to_target"] == 1.0 and out["sim_check"]["counts_equal"]
    (level,) = out["levels"]
    assert 0 < level["accepted"] < level["drafted"]
    for bad in ("controlled:1.5", "controlled:0.8@", "controlled:"):
        assert main(["run", "--target", "tiny:1", "--method", "sd", "--drafter", bad, "--policy", "fixed:k=3"]) == 2, bad
        err = capsys.readouterr().err.strip()
        assert "rates in [0, 1]" in err and len(err.splitlines()) == 1, err


# ------------------------------------------------- random-weight models of catalog shapes (issue 28)

def test_a_random_model_has_the_catalog_shape():
    """random:NAME builds the catalog entry's shape (so its forward costs the named model's):
    layers, widths, heads, vocabulary and tied embeddings, its parameter count the catalog's;
    the same seed, the same weights; every id it can emit decodes."""
    import torch

    from draftsim.realrun.models import load_model
    from draftsim.sim.cost import default_catalog

    spec = default_catalog().model("smollm2-135m")
    a = load_model("random:smollm2-135m:3", "cpu")
    cfg = a.model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.vocab_size, cfg.tie_word_embeddings) == (spec.layers, spec.hidden, spec.intermediate, spec.heads,
                                                                       spec.kv_heads, spec.head_dim, spec.vocab, spec.tied_embeddings)
    params = sum(p.numel() for p in a.model.parameters())
    assert abs(params - spec.params) / spec.params < 0.01, (params, spec.params)
    assert len(a.tokenizer) == spec.vocab and a.tokenizer.decode([spec.vocab - 1]) == f"<t{spec.vocab - 1}>"
    b = load_model("random:smollm2-135m:3", "cpu")
    c = load_model("random:smollm2-135m:4", "cpu")
    w = lambda m: m.model.model.layers[0].mlp.up_proj.weight  # noqa: E731
    assert torch.equal(w(a), w(b)) and not torch.equal(w(a), w(c))


def test_random_models_are_refused_before_loading(capsys):
    """Unknown names, non-integer seeds and shapes a Llama cannot take (MoE, MLA): one line, exit 2."""
    from draftsim.cli import main

    for name, fragment in (("random:nope", "unknown model 'nope'"), ("random:smollm2-135m:x", "random:NAME:SEED"),
                           ("random:", "random:NAME"), ("random:mixtral-8x7b", "dense Llama-shaped")):
        assert main(["run", "--target", name, "--max-new-tokens", "4"]) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and fragment in err, (name, err)


def test_controlled_acceptance_on_random_catalog_models(capsys):
    """A random SmolLM2-360M target drafted by the controlled drafter over a random SmolLM2-135M:
    lossless (the target's own output), and the acceptance the prescribed one within sampling error."""
    from draftsim.cli import main

    assert main(["run", "--target", "random:smollm2-360m", "--method", "sd", "--drafter", "controlled:0.7@random:smollm2-135m",
                 "--policy", "fixed:k=3", "--prompts", "code", "--n", "2", "--max-new-tokens", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["quality"]["identical_to_target"] == 1.0 and out["sim_check"]["counts_equal"]
    (level,) = out["levels"]
    assert level["drafted"] > 0 and 0.2 < level["accepted"] / level["drafted"] < 0.85
