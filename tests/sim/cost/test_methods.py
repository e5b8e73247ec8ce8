"""Drafting methods priced from the target's architecture (sim/cost/methods.py), against hand
counts from their papers and configs."""

from __future__ import annotations

import pytest

from draftsim.sim.cost.assembly import Deployment, assemble
from draftsim.sim.cost.catalog import default_catalog
from draftsim.sim.cost.methods import EAGLE3_DRAFT_VOCAB, parse_drafter
from draftsim.sim.errors import DraftsimError

H, I, V, KV, HD, HEADS = 4096, 14336, 128256, 8, 128, 32  # Llama-3.1-8B config.json


def hand_params(method: str) -> float:
    """Weights one draft call reads, counted by hand from the method's description."""
    qkv = H * (HEADS + 2 * KV) * HD
    o = HEADS * HD * H
    mlp = 3 * H * I
    if method == "eagle":  # one layer + fc 2h->h + the target's LM head
        return qkv + o + mlp + 2 * H * H + V * H
    if method == "eagle3":  # one layer whose QKV takes 2h inputs + LM head over the draft vocabulary
        return 2 * qkv + o + mlp + EAGLE3_DRAFT_VOCAB * H
    if method == "medusa":  # one head: residual block h x h + its own LM head
        return H * H + H * V
    raise AssertionError(method)


def one_call(method: str, batch=1, context=0) -> tuple[float, object]:
    a = assemble(Deployment("llama-3.1-8b", "h100-sxm", (method,), overheads="none"))
    return float(a.drafters[0].shape_time(batch, 1, context)), a


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa"])
def test_a_head_call_at_batch_one_reads_its_weights_once(method):
    """Decoding one token is memory-bound: the head's time is its weight bytes over the
    bandwidth the roofline grants (activations and one embedding row are < 0.1%), plus the fixed
    time of each kernel it runs (the H100's, derived from its measured tables): EAGLE's layer (2
    attention-projection GEMMs, 2 MLP GEMMs, attention, 3 elementwise) and the LM head's GEMM, and
    each of its own matrices (EAGLE's fusion layer; Medusa's residual block and LM head) a GEMM."""
    t, a = one_call(method)
    hw = default_catalog().hardware_spec("h100-sxm")
    f = hw.kernel_fixed
    layer = 4 * f["gemm"] + f["attention"] + 3 * f["elementwise"]
    fixed = {"eagle": layer + 2 * f["gemm"], "eagle3": layer + f["gemm"], "medusa": 2 * f["gemm"]}[method]  # eagle3's wider QKV: one kernel
    expected = hand_params(method) * 2 / (hw.memory_bandwidth * hw.mbu) + fixed
    assert t == pytest.approx(expected, rel=2e-3)


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa"])
def test_a_head_call_on_many_tokens_does_two_flops_per_weight_per_token(method):
    batch = 1 << 16
    t, _ = one_call(method, batch=batch)
    hw = default_catalog().hardware_spec("h100-sxm")
    flops = 2 * hand_params(method) * batch
    assert t == pytest.approx(flops / (hw.peak("bfloat16") * hw.mfu), rel=0.03)


def test_heads_add_to_the_targets_memory():
    a = assemble(Deployment("llama-3.1-8b", "h100-sxm", ("eagle3",), overheads="none"))
    head = a.drafters[0]
    # what one call reads, and the fusion layer (3h -> h, whole on every device) it holds beside them
    assert head.weight_bytes() == pytest.approx((hand_params("eagle3") + 3 * H * H) * 2)
    assert head.kv_bytes_per_token() == pytest.approx(2 * KV * HD * 2)  # one layer's K and V
    # a KV cache that fills the target's devices but for 0.5 GB: the target alone fits, with the head's GB it does not
    target = a.target
    hw = target.hardware
    free = hw.memory * hw.usable_memory - target.weight_bytes_per_device() - 0.5e9
    context = int(free / float(target.kv_bytes_per_device(1, 1))) - 1
    target.check_fits(1, context)
    assemble(Deployment("llama-3.1-8b", "h100-sxm", ("qwen2.5-0.5b",), drafter_tp=1)).check_fits([1], [context - 1], [1])
    with pytest.raises(DraftsimError, match="does not fit"):
        a.check_fits([1], [context - 1], [1])


def test_a_draft_model_runs_at_the_targets_tp_unless_told():
    a = assemble(Deployment("llama-3.1-70b", "h100-sxm", ("llama-3.1-8b",), tp=4))
    assert a.drafters[0].tp == 4
    b = assemble(Deployment("llama-3.1-70b", "h100-sxm", ("llama-3.1-8b",), tp=4, drafter_tp=1))
    assert b.drafters[0].tp == 1


def test_self_speculation_caps_the_context_it_attends_to():
    a = assemble(Deployment("llama-3.1-8b", "h100-sxm", ("selfspec:window=1024",), overheads="none"))
    target, draft = a.target, a.drafters[0]
    assert float(draft.shape_time(32, 1, 512)) == pytest.approx(float(target.shape_time(32, 1, 512)))
    assert float(draft.shape_time(32, 1, 60_000)) == pytest.approx(float(target.shape_time(32, 1, 1024)))


def test_lookups_cost_nothing_without_a_profile():
    a = assemble(Deployment("llama-3.1-8b", "h100-sxm", ("ngram", "suffix")))
    assert all(float(d.shape_time(8, 1, 100)) == 0.0 for d in a.drafters)
    assert "free" in a.info["backends"]["ngram"]


@pytest.mark.parametrize("text, words", [
    ("mtp", ["mtp needs a target with multi-token-prediction modules", "llama-3.1-8b"]),
    ("eagle3:draft_vocab=999999", ["exceeds", "128256"]),
    ("eagle3:vocab=3", ["unknown option", "draft_vocab"]),
    ("selfspec", ["needs window=B"]),
    ("ngram:n=3", ["takes no options"]),
    ("draft_model:", ["needs a model"]),
    ("no-such-model", ["unknown model 'no-such-model'"]),
])
def test_bad_drafters_are_refused(text, words):
    with pytest.raises(DraftsimError) as e:
        assemble(Deployment("llama-3.1-8b", "h100-sxm", (text,)))
    for w in words:
        assert w in str(e.value)


def test_parse_names_methods_as_engines_do():
    assert parse_drafter("EAGLE3").method == "eagle3"
    assert parse_drafter("qwen2.5-0.5b").method == "draft_model" and parse_drafter("qwen2.5-0.5b").model == "qwen2.5-0.5b"
    assert parse_drafter("draft_model:qwen2.5-0.5b").model == "qwen2.5-0.5b"
    assert dict(parse_drafter("selfspec:window=2048").options) == {"window": 2048}


def test_selfspec_caps_each_sequences_context_in_serving():
    """The serving simulator caps a self-speculating drafter's context sequence by sequence:
    Σ min(c_i, B) ≤ n · min(mean c, B) (min is concave), so a batch of short and long contexts
    drafts for less than the mean cap would charge; equal lengths give the same as the mean cap."""
    import numpy as np

    from draftsim.sim import acceptance, policies
    from draftsim.sim.cost import RooflineModel, default_catalog
    from draftsim.sim.cost.methods import CappedContext
    from draftsim.sim.serving import ServingConfig, serve
    from draftsim.sim.serving.workload import Workload

    cat = default_catalog()
    target = RooflineModel(cat.model("llama-3.1-8b"), cat.hardware_spec("h100-sxm"))

    def draft_seconds(prompts, per_sequence):
        drafter = CappedContext(target, 1024)
        if not per_sequence:
            del drafter.context_cap  # the batch-statistics path: the mean context capped
        cfg = ServingConfig(policies.FixedK(3), acceptance.Bernoulli(0.7), target, [drafter], kv_tokens=1 << 20)
        wl = Workload(np.zeros(len(prompts)), np.asarray(prompts, dtype=np.int64), np.full(len(prompts), 64), np.zeros(len(prompts), dtype=np.int64))
        return float(serve(cfg, wl, seed=0).steps["draft"].sum())

    mixed = [256, 16_000]
    assert draft_seconds(mixed, True) < draft_seconds(mixed, False)
    same = [8_000, 8_000]
    assert draft_seconds(same, True) == pytest.approx(draft_seconds(same, False), rel=1e-12)
