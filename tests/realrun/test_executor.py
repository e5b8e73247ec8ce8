"""The real-model executor: sim policies drive tiny HF models; lossless checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from toy import chi_square_pvalue

from draftsim.realrun.drafters import MaxGram, NeuralDraft
from draftsim.realrun.executor import Sampling, generate, token_cascade
from draftsim.realrun.models import cache_arg, load_model, tiny_model
from draftsim.sim import policies as P
from draftsim.sim.distributions import warp
from draftsim.sim.errors import DraftsimError
from draftsim.sim.rules import OPT, SD, Chow, Diff, Leniency, TokenV3


@pytest.fixture(scope="module")
def target():
    return load_model("tiny:1")


@pytest.fixture(scope="module")
def drafters(target):
    return {"tiny2": NeuralDraft(load_model("tiny:2"), "tiny2"), "self": NeuralDraft(load_model("tiny:1"), "self"),
            "maxgram": MaxGram(target.vocab_size)}


PROMPT_TEXT = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
POLICIES = [P.FixedK(1), P.FixedK(4), P.Heuristic(), P.ConfidenceStop(0.5, 6), P.Threshold(0.6, 6)]


def own_greedy(target, prompt, n):
    with torch.inference_mode():
        out = target.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=target.tokenizer.pad_token_id)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
@pytest.mark.parametrize("name", ["tiny2", "self", "maxgram"])
def test_greedy_output_is_the_targets_own(target, drafters, policy, name):
    prompt = target.tokenizer(PROMPT_TEXT)["input_ids"]
    log = generate(target, prompt, 30, policy, drafters[name], stop_at_eos=False)
    assert log.output == own_greedy(target, prompt, 30)
    assert sum(r.accepted + 1 for r in log.rounds) >= log.tokens
    if name == "self":  # a drafter identical to the target: every drafted token is accepted
        assert all(r.accepted == r.drafted for r in log.rounds)
        assert log.target_calls < log.tokens


CASCADES = [
    (P.VerticalCascade([[0, 2, 0], [0, 0, 3], [0, 0, 0]]), ("tiny2", "maxgram")),
    (P.VerticalCascade([[0, 3, 0], [0, 0, 2], [0, 0, 0]], leniency=3.0), ("tiny2", "maxgram")),
    (P.VerticalCascade([[0, 1, 2], [0, 0, 4], [0, 0, 0]], leniency=2.0), ("tiny2", "maxgram")),  # vertical + horizontal
    (P.VerticalCascade([[0, 2, 0, 0], [0, 0, 2, 0], [0, 0, 0, 3], [0, 0, 0, 0]], leniency=2.0), ("self", "tiny2", "maxgram")),
    (P.HorizontalCascade((1, 2), (2, 3)), ("tiny2", "maxgram")),
]


@pytest.mark.parametrize("policy,names", CASCADES, ids=[repr(c[0]) for c in CASCADES])
def test_cascades_reproduce_the_targets_greedy_output(target, drafters, policy, names):
    """CS Drafting, vertical (nested three deep, lenient inner levels) and horizontal: lossless."""
    prompt = target.tokenizer(PROMPT_TEXT)["input_ids"]
    log = generate(target, prompt, 30, policy, drafters=[drafters[n] for n in names], stop_at_eos=False)
    assert log.output == own_greedy(target, prompt, 30)
    levels = log.levels()
    assert all(v["accepted"] <= v["drafted"] for v in levels.values())
    bottom = len(names)  # the last drafter proposes to the one above it (vertical) or to the target
    assert any(p == bottom for p, _ in levels)
    assert log.calls_per_model(len(names) + 1)[0] == log.target_calls == len(log.rounds)


def test_greedy_rules_at_their_extremes(target, drafters):
    """Chow with alpha = 0 always defers (the target's greedy text); alpha = 1 never does (the
    drafter's own greedy text) — through block verification and the sequential cascade alike."""
    prompt = target.tokenizer(PROMPT_TEXT)["input_ids"]
    d = drafters["tiny2"]
    mine = own_greedy(target, prompt, 20)
    theirs = own_greedy(d.loaded, prompt, 20)
    assert mine != theirs
    for rule in (Chow(0.0), Leniency(1.0), TokenV3(0.0)):
        assert generate(target, prompt, 20, P.FixedK(3), d, rule=rule, stop_at_eos=False).output == mine, rule
    # Chow(1) keeps every draft; only the bonus tokens (every 4th) come from the target.
    never = generate(target, prompt, 20, P.FixedK(3), d, rule=Chow(1.0), stop_at_eos=False)
    assert all(r.accepted == r.drafted == 3 for r in never.rounds[:-1]) and never.output != mine
    assert token_cascade(target, d, prompt, 20, Chow(0.0), stop_at_eos=False).output == mine
    log = token_cascade(target, d, prompt, 20, Chow(1.0))  # HF generate stops at EOS; so does this
    assert log.output == theirs and log.target_calls == 0 and log.draft_calls == len(theirs)


def test_greedy_lenient_top_level_accepts_more(target, drafters):
    prompt = target.tokenizer(PROMPT_TEXT)["input_ids"]
    strict = generate(target, prompt, 40, P.FixedK(4), drafters["tiny2"], stop_at_eos=False)
    lenient = generate(target, prompt, 40, P.FixedK(4), drafters["tiny2"], rule=Leniency(1e6), stop_at_eos=False)
    assert all(r.accepted == r.drafted for r in lenient.rounds)  # l -> inf keeps every draft
    assert lenient.target_calls < strict.target_calls


def test_autoregressive_baseline(target):
    prompt = target.tokenizer("hello")["input_ids"]
    log = generate(target, prompt, 12, stop_at_eos=False)
    assert log.output == own_greedy(target, prompt, 12) and log.target_calls == 12


def _row(model, ids):
    with torch.inference_mode():
        return warp(torch.softmax(model.model(torch.tensor([ids])).logits[0, -1].double(), -1).numpy(), 1.0, 4)


def _exact_two_tokens(target, draft, prompt, rule):
    """Exact distribution of two tokens decoded with temperature 1, top-k 4: the first follows
    π(q₁, p₁) of the rule, the second π(q₂, p₂) given the first ([SC]); π = p for SD."""
    pi = lambda ids: rule.target(_row(draft, ids), _row(target, ids))  # noqa: E731
    first = pi(prompt)
    exact = {}
    for x in np.flatnonzero(first > 0):
        second = pi(prompt + [int(x)])
        for y in np.flatnonzero(second > 0):
            exact[(int(x), int(y))] = first[x] * second[y]
    return exact


SAMPLED = [
    ("sd", P.FixedK(2), ("tiny2",), SD()),
    ("csd-vertical-lenient", P.VerticalCascade([[0, 2, 0], [0, 0, 2], [0, 0, 0]], leniency=3.0), ("tiny2", "maxgram"), SD()),
    ("csd-horizontal", P.HorizontalCascade((1, 2), (1, 2)), ("tiny2", "maxgram"), SD()),
    ("cascade-opt", P.FixedK(2), ("tiny2",), OPT(0.3)),
    ("cascade-chow", P.FixedK(2), ("tiny2",), Chow(0.5)),  # defers at some positions, not all
]


@pytest.mark.parametrize("name,policy,names,rule", SAMPLED, ids=[s[0] for s in SAMPLED])
def test_sampling_follows_the_exact_distribution(target, drafters, name, policy, names, rule):
    """Two tokens sampled with temperature 1 and top-k 4 through speculative steps: chi-square
    against the exact distribution (p for lossless methods, the rule's π for speculative
    cascades; at most 16 cells), significance 1e-3, fixed seed."""
    prompt = target.tokenizer("ab")["input_ids"]
    sampling = Sampling(1.0, 4)
    exact = _exact_two_tokens(target, drafters["tiny2"].loaded, prompt, rule)
    rng = np.random.default_rng(0)
    counts: dict = {}
    n = 2000
    models = [drafters[m] for m in names]
    for _ in range(n):
        out = tuple(generate(target, prompt, 2, policy, sampling=sampling, rule=rule, rng=rng, stop_at_eos=False, drafters=models).output)
        counts[out] = counts.get(out, 0) + 1
    assert set(counts) <= set(exact)
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_bad_input(target, drafters):
    prompt = target.tokenizer("x")["input_ids"]
    other = tiny_model(3)
    other.model.resize_token_embeddings(50)
    with pytest.raises(DraftsimError, match="different vocabularies"):
        generate(target, prompt, 4, P.FixedK(2), NeuralDraft(other, "other"))
    with pytest.raises(DraftsimError, match="exceeds the target's context"):
        generate(target, prompt * 1100, 4)
    with pytest.raises(DraftsimError, match="needs 1 drafter"):
        generate(target, prompt, 4, P.FixedK(2))
    with pytest.raises(DraftsimError, match="sampling needs rng"):
        generate(target, prompt, 4, P.FixedK(2), drafters["tiny2"], Sampling(1.0))
    with pytest.raises(DraftsimError, match="needs 2 drafter"):  # a K matrix over 3 models, one drafter
        generate(target, prompt, 4, P.VerticalCascade([[0, 1, 0], [0, 0, 2], [0, 0, 0]]), drafters["tiny2"])
    with pytest.raises(DraftsimError, match="a K matrix must have one row"):
        generate(target, prompt, 4, P.FixedK(2), drafters=[drafters["tiny2"], drafters["maxgram"]])
    with pytest.raises(DraftsimError, match="tree policy"):
        generate(target, prompt, 4, P.Tree(2, 2), drafters["tiny2"])
    with pytest.raises(DraftsimError, match="defers on the draft alone"):
        token_cascade(target, drafters["tiny2"], prompt, 4, Diff(0.1))
    renamed = tiny_model(4)
    vocab = renamed.tokenizer.get_vocab()
    a, b = sorted(vocab)[:2]
    swapped = dict(vocab, **{a: vocab[b], b: vocab[a]})
    renamed.tokenizer.get_vocab = lambda: swapped
    with pytest.raises(DraftsimError, match="does not share the target's tokenizer"):
        generate(target, prompt, 4, P.FixedK(2), NeuralDraft(renamed, "renamed"))


def test_run_cli_on_tiny_models(capsys):
    import json

    from draftsim.cli import main

    assert main(["run", "--model", "tiny:1", "--method", "sd", "--drafter", "tiny:1", "--policy", "fixed:k=3",
                 "--prompts", "arithmetic", "--n", "2", "--max-new-tokens", "12", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (level,) = data["levels"]
    assert level["accepted"] == level["drafted"]  # the drafter is the target itself
    assert data["mean_accepted_length"] > 1.5 and data["quality"]["identical_to_target"] == 1.0
    assert data["sim_check"]["counts_equal"]
    assert main(["run", "--model", "tiny:1", "--method", "sd", "--drafter", "maxgram", "--policy", "warp:k=2"]) == 2
    assert "unknown policy" in capsys.readouterr().err
    for argv, message in (
        (["--method", "sd", "--rule", "chow:alpha=0.3"], "lossless"),
        (["--method", "csd", "--drafter", "maxgram", "--policy", "vertical:n=2,k=2"], "uses 2 drafter"),
        (["--method", "sd", "--drafter", "tiny:2,maxgram", "--policy", "vertical:n=2,k=2"], "use --method csd"),
        (["--method", "cascade", "--drafter", "tiny:2", "--rule", "opt:alpha=0.3", "--sequential"], "defers on the draft alone"),
        (["--method", "ar", "--drafter", "tiny:2"], "takes no --drafter"),
    ):
        assert main(["run", "--model", "tiny:1", "--n", "1", "--max-new-tokens", "4", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv


# ---------------------------------------------------------------- run traces and the simulator check

REPLAYS = [
    ("sd", "fixed:k=3", "tiny:2", "sd", True),
    ("sd", "heuristic:k=2,kmax=8", "maxgram", "sd", True),
    ("sd", "confidence:tau=0.6,kmax=6", "maxgram", "sd", True),  # Max-Gram's match-length confidence
    ("sd", "confidence:tau=0.3,kmax=6", "tiny:2", "sd", True),
    ("sd", "threshold:h=0.8,kmax=6", "tiny:2", "sd", True),
    ("cascade", "fixed:k=3", "tiny:2", "chow:alpha=0.4", True),
    ("csd", "horizontal:counts=2,3", "tiny:2,maxgram", "sd", True),
    ("csd", "vertical:n=2,k=3,leniency=2", "tiny:2,maxgram", "sd", False),
]


@pytest.mark.parametrize("method,policy,drafter,rule,exact", REPLAYS, ids=[f"{r[0]}-{r[1]}" for r in REPLAYS])
def test_run_traces_replay_in_the_simulator(tmp_path, target, method, policy, drafter, rule, exact):
    """A greedy run's trace, replayed with the same policy by the Monte Carlo engine, gives
    the same target calls, drafted and accepted tokens (single drafter or horizontal);
    vertical cascades within 5%."""
    from draftsim.analysis.reality import check_run, held_to_sim
    from draftsim.realrun.compare import measure
    from draftsim.realrun.methods import method_from
    from draftsim.realrun.prompts import prompt_set
    from draftsim.sim.traces import RunTrace

    m = method_from(method, target, drafter, policy, rule)
    prompts = prompt_set("code", "test", 3) + prompt_set("arithmetic", "test", 3)
    out = held_to_sim(measure(target, m, prompts, 40, trace_dir=tmp_path / "run"))
    trace = RunTrace(tmp_path / "run")
    assert len(trace.entries) == 6 and trace.metadata["policy"] == policy
    assert trace.rounds.num_rows == out["target_calls"] and sum(trace.rounds["emitted"].to_pylist()) == out["tokens"]
    check = check_run(trace)
    assert check == out["sim_check"]  # the replay is deterministic
    if exact:
        assert check["counts_equal"], (check["sim"], check["real"])
    else:
        assert all(abs(e) < 0.05 for e in check["count_errors"].values()), check["count_errors"]
    assert check["sim"]["tokens"] == check["real"]["tokens"]
    assert abs(check["model_time_error"]) < 0.25  # the fitted a + b·n costs price the calls
    if method != "cascade":
        assert out["quality"]["identical_to_target"] == 1.0


def test_run_trace_resume_and_errors(tmp_path, target, capsys):
    from draftsim.cli import main
    from draftsim.sim.traces import RunTrace, Trace, TraceError

    base = ["run", "--model", "tiny:1", "--method", "sd", "--drafter", "maxgram", "--n", "2", "--max-new-tokens", "8",
            "--trace", str(tmp_path / "t")]
    assert main(base + ["--prompts", "code"]) == 0
    assert main(base + ["--prompts", "code"]) == 2 and "--resume" in capsys.readouterr().err
    assert main(base + ["--prompts", "code", "--resume"]) == 0
    assert "run trace:" in capsys.readouterr().out
    assert len(RunTrace(tmp_path / "t").entries) == 2
    assert main(["check-sim", str(tmp_path / "t"), "--json"]) == 0
    assert json_load(capsys.readouterr().out)["counts_equal"]
    with pytest.raises(TraceError, match="a run trace"):
        Trace(tmp_path / "t")
    (tmp_path / "t" / "drafts").joinpath(sorted(p.name for p in (tmp_path / "t" / "drafts").iterdir())[0]).write_bytes(b"junk")
    assert main(["check-sim", str(tmp_path / "t")]) == 2 and "checksum" in capsys.readouterr().err


def json_load(text):
    import json

    return json.loads(text)


# ---------------------------------------------------------------- the shared round loop and the records

def test_decode_trims_at_eos_and_budget_and_records_rounds():
    """The round loop on scripted rounds (no model): tokens cut at the budget and after EOS,
    one Round per step, chain counts cut to the final text, overhead outside the calls."""
    from draftsim.realrun.executor import RoundResult, RunLog, decode
    from draftsim.sim.records import Call

    def scripted(rounds):
        it = iter(rounds)

        def step(context, budget):
            tokens, drafted, accepted = next(it)
            log.calls.append(Call(len(log.rounds), 0, "verify", drafted + 1, 0.0))
            seen.append((list(context), budget))
            return RoundResult(tokens, drafted, accepted, 0.0, 0.0)
        return step

    log, seen = RunLog(), []
    decode(log, [1, 2], 5, None, scripted([([3, 4, 5], 3, 2), ([6], 3, 0), ([7, 8, 9], 2, 2)]), 0.0)
    assert log.output == [3, 4, 5, 6, 7] and [r.emitted for r in log.rounds] == [3, 1, 1]
    assert seen == [([1, 2], 5), ([1, 2, 3, 4, 5], 2), ([1, 2, 3, 4, 5, 6], 1)]
    assert [(r.round, r.start) for r in log.rounds] == [(0, 0), (1, 3), (2, 4)]
    assert [(r.drafted, r.accepted) for r in log.rounds] == [(3, 2), (2, 0), (1, 1)]  # cut to the text's 5 positions
    assert all(r.overhead_seconds >= 0 for r in log.rounds) and log.seconds > 0
    log, seen = RunLog(), []
    decode(log, [1], 10, 0, scripted([([3, 0, 4], 4, 2), ([5], 0, 0)]), 0.0, in_text=False)
    assert log.output == [3, 0] and len(log.rounds) == 1 and (log.rounds[0].drafted, log.rounds[0].accepted) == (4, 2)
    log = RunLog()
    decode(log, [1], 0, None, scripted([]), 0.0)
    assert log.output == [] and log.rounds == []


def test_maxgram_confidence_stop_drafts_only_matched_continuations(target, drafters):
    """Max-Gram under ConfidenceStop: a draft ends after the first token of confidence < τ (a
    fallback token where nothing matches: a one-token draft); lossless; the rounds' overhead
    adds up. (The simulator's exact replay of such a run: REPLAYS above.)"""
    prompt = target.tokenizer(PROMPT_TEXT)["input_ids"]
    policy = P.ConfidenceStop(0.6, 6)  # needs a match of two tokens (2/3 >= 0.6) to go on
    log = generate(target, prompt, 40, policy, drafters["maxgram"], stop_at_eos=False)
    assert log.output == own_greedy(target, prompt, 40)
    by_round: dict = {}
    for d in log.drafts:
        by_round.setdefault(d.round, []).append(d.conf)
    assert set(by_round) == {r.round for r in log.rounds}
    for confs in by_round.values():
        assert all(c >= 0.6 for c in confs[:-1]) and len(confs) <= 6
        assert all(c in (0.0, 0.5) or c >= 2 / 3 for c in confs)  # m / (m + 1)
        if confs[0] == 0.0:
            assert len(confs) == 1
    assert any(len(c) == 1 for c in by_round.values()) and any(len(c) > 1 for c in by_round.values())
    fixed = generate(target, prompt, 40, P.FixedK(6), drafters["maxgram"], stop_at_eos=False)
    assert log.drafted - log.accepted < fixed.drafted - fixed.accepted  # fewer tokens verified in vain
    # The executor's own time: every round's overhead is outside its calls, and all of it adds up.
    assert all(r.overhead_seconds >= 0 for r in log.rounds)
    assert log.call_seconds + sum(r.overhead_seconds for r in log.rounds) <= log.seconds + 1e-9


def test_protocol_attributes_are_declared_on_the_base_classes():
    from draftsim.realrun.drafters import Bigram, Drafter
    from draftsim.sim.policies import Policy
    from draftsim.sim.rules import Rule

    for name, default in (("vocab", None), ("loaded", None), ("tokenizer", None), ("head", None), ("neural", False)):
        assert getattr(Drafter, name) == default, name
    assert Policy.leniency == 1.0 and P.FixedK(2).leniency == 1.0 and P.VerticalCascade([[0, 1], [0, 0]], leniency=2.0).leniency == 2.0
    assert Rule.draft_only is False and Chow(0.3).draft_only and not Diff(0.1).draft_only
    assert Bigram(10).tokenizer is None and MaxGram(10).loaded is None


def test_prefill_rides_on_the_first_verification(target, drafters):
    """prefill_apart=False: one target call fewer, the same output; the first verification
    says how many prompt tokens it carried (as many as the separate prefill feeds)."""
    prompt = target.tokenizer(PROMPT_TEXT)["input_ids"]
    apart = generate(target, prompt, 20, P.ConfidenceStop(0.4, 4), drafters["maxgram"], stop_at_eos=False)
    along = generate(target, prompt, 20, P.ConfidenceStop(0.4, 4), drafters["maxgram"], stop_at_eos=False, prefill_apart=False)
    assert along.output == apart.output == own_greedy(target, prompt, 20)
    t_apart, t_along = [c for c in apart.calls if c.model == 0], [c for c in along.calls if c.model == 0]
    assert t_apart[0].kind == "prefill" and t_apart[0].n_tokens == len(prompt) - 1 and apart.prefill_seconds > 0
    assert len(t_along) == len(t_apart) - 1 and all(c.kind == "verify" for c in t_along) and along.prefill_seconds == 0
    first = t_along[0]
    assert first.round == 0 and first.prompt_tokens == len(prompt) - 1 and first.n_tokens == len(prompt) + along.rounds[0].drafted
    assert all(c.prompt_tokens == 0 for c in along.calls + apart.calls if c is not first)
    assert along.target_calls == apart.target_calls == len(along.rounds)


def test_the_single_stream_cache_is_a_batch_of_one(target):
    """CachedLM is the batched server's ragged cache with one row: through drafts, rejections
    (rollbacks) and a rollback to nothing, each call's logits and hidden states are the model's
    own call on a cache cropped to the same prefix, bit for bit, and no stale slot survives."""
    from transformers import DynamicCache

    from draftsim.realrun.kvcache import CachedLM

    text = target.tokenizer(PROMPT_TEXT)["input_ids"]
    lm, ref, held = CachedLM(target), DynamicCache(), []
    calls = [(text[:6], 1), (text[:6] + [1, 2, 3], 4), (text[:9], 2), (text[:9] + [4], 2), ([7] + text[1:5], 1)]
    for context, rows in calls:
        logits, hidden = lm.logits(context, rows, hidden=True)
        keep = next((i for i, (a, b) in enumerate(zip(held, context)) if a != b), min(len(held), len(context)))
        keep = min(keep, len(context) - rows)
        if keep < len(held):
            ref = DynamicCache() if keep == 0 else ref
            if keep:
                ref.crop(keep - len(held))
            del held[keep:]
        with torch.inference_mode():
            out = target.model(torch.tensor([context[keep:]]), **{cache_arg(target.model): ref}, use_cache=True, output_hidden_states=True,
                               logits_to_keep=rows)
        held.extend(context[keep:])
        assert lm.fed == len(context) - keep and lm.ids == held
        assert torch.equal(logits, out.logits[0].float()) and torch.equal(hidden, out.hidden_states[-1][0, -rows:])
        assert lm.kv.length == len(held) and bool(lm.kv.valid.all())
