"""Every byte in the memory plan (sim/serving/kvcache.py memory_plan): each drafting method's
weights and KV cache counted from its architecture, by hand here from the config numbers, as
vLLM lays them out over tensor parallelism (sim/data/drafting_methods.json ``replicated``), the
KV capacity they leave, and the CUDA-graph memory an engine takes out of its KV budget."""

from __future__ import annotations

import json

import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim.cost import CallCost
from draftsim.sim.cost.assembly import Deployment, assemble
from draftsim.sim.cost.memory import MemoryFootprint
from draftsim.sim.cost.methods import EAGLE3_DRAFT_VOCAB, HeadCost, Lookup
from draftsim.sim.cost.overheads import ENGINES, ENGINES_FILE
from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving import kvcache
from draftsim.sim.serving.kvcache import memory_plan

BF16 = 2
# Llama-3.1-8B config.json
H, I, V, KV, HD, HEADS, LAYERS = 4096, 14336, 128256, 8, 128, 32, 32
QKV, O, MLP = H * (HEADS + 2 * KV) * HD, HEADS * HD * H, 3 * H * I


def llama_kv(tp: int, layers: int = LAYERS) -> float:
    """K and V of ``layers`` layers per token on one of ``tp`` devices (KV heads split, replicated below one a device)."""
    return 2 * max(KV // tp, 1) * HD * layers * BF16


def head_weights(method: str, tp: int) -> float:
    """A head's weights per device, counted from its architecture: the decoder layer's projections
    and LM heads split over tp (vLLM's parallel layers), the small projections whole (nn.Linear,
    ReplicatedLinear); embeddings, and EAGLE's LM head, are the target's."""
    if method == "eagle":  # one layer + fc 2h -> h (whole)
        return ((QKV + O + MLP) / tp + 2 * H * H) * BF16
    if method == "eagle3":  # one layer whose QKV takes 2h inputs + its draft-vocabulary LM head + the fusion fc 3h -> h (whole)
        return ((2 * QKV + O + MLP + EAGLE3_DRAFT_VOCAB * H) / tp + 3 * H * H) * BF16
    if method == "medusa":  # 4 heads, each a residual block h x h (whole) and its own LM head h x V
        return 4 * (H * H + V * H / tp) * BF16
    raise AssertionError(method)


def plan_of(target: str, drafters: tuple[str, ...], tp: int = 1, hardware: str = "h100-sxm", dtype: str = "bfloat16",
            tokens: int = 8192, **kw):
    a = assemble(Deployment(target, hardware, drafters, tp=tp, dtype=dtype, overheads="none"))
    return memory_plan(a.target, a.drafters, max_batched_tokens=tokens, **kw), a


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa"])
def test_a_heads_weights_and_kv_are_its_architectures_and_lower_the_kv_tokens(method, tp):
    alone, _ = plan_of("llama-3.1-8b", (), tp)
    plan, a = plan_of("llama-3.1-8b", (method,), tp)
    kv = 0.0 if method == "medusa" else llama_kv(tp, layers=1)  # EAGLE heads cache their one layer's K and V; Medusa none
    assert plan.drafter_weights == pytest.approx(head_weights(method, tp), rel=1e-12) and plan.drafter_weights > 0
    assert plan.drafter_kv_bytes_per_token == pytest.approx(kv, rel=1e-12)
    assert plan.target_kv_bytes_per_token == pytest.approx(llama_kv(tp), rel=1e-12)
    assert plan.kv_bytes_per_token == pytest.approx(llama_kv(tp) + kv, rel=1e-12)
    assert plan.target_weights == alone.target_weights and plan.activations == alone.activations
    free = alone.usable - alone.target_weights - alone.activations - plan.drafter_weights
    assert plan.tokens == int(free // (llama_kv(tp) + kv)) < alone.tokens
    assert a.drafters[0].memory().attached  # a head shares the target's devices ...
    apart, _ = plan_of("llama-3.1-8b", (method,), tp, separate_drafter=True)
    assert apart == plan  # ... whatever the placement of draft models


def glm_mtp(tp: int) -> tuple[float, float]:
    """GLM-4.5-Air's MTP module per device (config.json): one MoE block (attention 96/8 heads x 128,
    router, 128 routed + 1 shared expert of 3 x h x 1408) split over tp and the projection 2h -> h
    whole; its layer's K and V per token."""
    h = 4096
    attention = h * (96 + 2 * 8) * 128 + 96 * 128 * h
    moe = h * 128 + (128 + 1) * 3 * h * 1408
    return ((attention + moe) / tp + 2 * h * h) * BF16, 2 * max(8 // tp, 1) * 128 * BF16


def deepseek_mtp(tp: int) -> tuple[float, float]:
    """DeepSeek-V3's MTP module per device in float8 (config.json): one MoE block with latent
    attention (q 7168 -> 1536 -> 128 x 192; kv 7168 -> 512 + 64, 512 -> 128 x (128 + 128); o
    128 x 128 -> 7168), router, 256 routed + 1 shared expert of 3 x 7168 x 2048, split over tp as the
    target's roofline splits its layers, and the projection 2h -> h whole; the latent and the rotary
    key per token (576 values, on every device) in the cache's bfloat16 (--kv-cache-dtype auto: the
    model's data type, 2 bytes, whatever the weights' format)."""
    h = 7168
    attention = h * 1536 + 1536 * 128 * 192 + h * (512 + 64) + 512 * 128 * (192 - 64 + 128) + 128 * 128 * h
    moe = h * 256 + (256 + 1) * 3 * h * 2048
    return ((attention + moe) / tp + 2 * h * h) * 1, (512 + 64) * 2


@pytest.mark.parametrize("target, tp, hardware, dtype, count", [
    ("glm-4.5-air", 4, "h100-sxm", "bfloat16", glm_mtp),
    ("glm-4.5-air", 8, "h100-sxm", "bfloat16", glm_mtp),
    ("deepseek-v3", 8, "h200", "float8", deepseek_mtp),
])
def test_an_mtp_modules_moe_block_and_kv_are_in_the_plan(target, tp, hardware, dtype, count):
    alone, _ = plan_of(target, (), tp, hardware, dtype)
    plan, _ = plan_of(target, ("mtp",), tp, hardware, dtype)
    weights, kv = count(tp)
    assert plan.drafter_weights == pytest.approx(weights, rel=1e-12) and plan.drafter_weights > 1e9 / tp
    assert plan.drafter_kv_bytes_per_token == pytest.approx(kv, rel=1e-12) and kv > 0
    assert plan.tokens < alone.tokens
    free = alone.usable - alone.target_weights - alone.activations - weights
    assert plan.tokens == int(free // (alone.kv_bytes_per_token + kv))


QWEN05 = dict(h=896, i=4864, layers=24, heads=14, kv=2, hd=64, vocab=151936)  # Qwen2.5-0.5B config.json (tied embeddings)


def test_a_draft_models_weights_and_cache_are_its_own():
    q = QWEN05
    weights = (q["layers"] * (q["h"] * (q["heads"] + 2 * q["kv"]) * q["hd"] + q["heads"] * q["hd"] * q["h"] + 3 * q["h"] * q["i"])
               + q["vocab"] * q["h"]) * BF16
    kv = 2 * q["kv"] * q["hd"] * q["layers"] * BF16
    alone, _ = plan_of("llama-3.1-8b", ())
    plan, a = plan_of("llama-3.1-8b", ("qwen2.5-0.5b",))
    assert plan.drafter_weights == pytest.approx(weights, rel=1e-12)
    assert plan.drafter_kv_bytes_per_token == pytest.approx(kv, rel=1e-12)
    assert plan.tokens < alone.tokens
    assert not a.drafters[0].memory().attached
    apart, _ = plan_of("llama-3.1-8b", ("qwen2.5-0.5b",), separate_drafter=True)  # on a device of its own
    assert apart.drafter_weights == 0 and apart.drafter_kv_bytes_per_token == 0 and apart.tokens == alone.tokens


@pytest.mark.parametrize("method", ["selfspec:window=1024", "ngram", "suffix", "maxgram", "bigram"])
def test_lookups_and_self_speculation_hold_nothing(method):
    """Lookups keep their tables in host memory; self-speculation is the target reading a window
    of its own cache: the plan is the target's alone, and says so (nothing unknown)."""
    alone, _ = plan_of("llama-3.1-8b", ())
    plan, a = plan_of("llama-3.1-8b", (method,))
    assert plan.drafter_weights == 0 and plan.drafter_kv_bytes_per_token == 0 and plan.unknown == ()
    assert plan.tokens == alone.tokens
    assert isinstance(a.drafters[0], Lookup) == (method != "selfspec:window=1024")


def test_a_model_whose_memory_is_unknown_is_named_not_counted():
    """A measured profile or a linear cost knows no memory: a target of that kind leaves the plan
    unknown (give --kv-tokens); a drafter of that kind is named in the plan, not counted as 0."""
    _, a = plan_of("llama-3.1-8b", ())
    assert CallCost(0.02).memory() is None
    assert memory_plan(CallCost(0.02), [], max_batched_tokens=2048) is None
    plan = memory_plan(a.target, [CallCost(0.001)], max_batched_tokens=2048)
    assert plan.unknown == ("linear 0.001 + 0·n",) and plan.drafter_weights == 0
    assert "not known" in plan.describe() and plan.to_dict()["unknown"] == ["linear 0.001 + 0·n"]


def test_cuda_graph_memory_comes_from_the_engine_that_captures_graphs(monkeypatch):
    _, a = plan_of("llama-3.1-8b", ("eagle3",))
    bare = memory_plan(a.target, a.drafters, max_batched_tokens=8192)
    for name in ("none", "sglang"):  # no graphs captured in draftsim's entries for these: nothing
        plan = memory_plan(a.target, a.drafters, max_batched_tokens=8192, engine=ENGINES[name])
        assert plan.graph_memory == 0 and plan.graph_note == "" and plan.tokens == bare.tokens
    vllm = memory_plan(a.target, a.drafters, max_batched_tokens=8192, engine=ENGINES["vllm"])
    entry = json.loads(ENGINES_FILE.read_text())["engines"]["vllm"]["cuda_graph_memory"]
    assert vllm.graph_memory == entry["bytes_in_kv_budget"] == 0  # v0.10.1 captures them outside its KV budget
    assert vllm.graph_note == entry["plan_note"] and "CUDA graphs" in vllm.describe() and vllm.tokens == bare.tokens
    # an engine that takes its graphs out of the KV budget leaves that many bytes fewer
    entries = kvcache._engine_entries()
    monkeypatch.setitem(entries, "vllm", {**entries["vllm"], "cuda_graph_memory": {"bytes_in_kv_budget": 2e9, "plan_note": "x"}})
    taken = memory_plan(a.target, a.drafters, max_batched_tokens=8192, engine=ENGINES["vllm"])
    assert taken.graph_memory == 2e9
    assert taken.tokens == int((bare.usable - bare.target_weights - bare.drafter_weights - bare.activations - 2e9)
                               // bare.kv_bytes_per_token) < bare.tokens
    # an engine that captures no graphs takes none, whatever its entry says
    monkeypatch.setitem(entries, "none", {**entries["none"], "cuda_graph_memory": {"bytes_in_kv_budget": 2e9}})
    assert memory_plan(a.target, a.drafters, max_batched_tokens=8192, engine=ENGINES["none"]).graph_memory == 0


METHODS = ["eagle", "eagle3", "medusa", "qwen2.5-0.5b", "selfspec:window=512", "ngram", "maxgram"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(METHODS), max_size=2), st.sampled_from([1, 2, 4]), st.integers(1, 1 << 16),
       st.floats(0.0, 20e9), st.booleans())
def test_the_plan_never_places_more_than_the_usable_memory_and_leaves_less_than_a_token(drafters, tp, tokens, graphs, apart):
    """Capacity × KV per token + weights + activations + graphs ≤ usable memory, and one more
    token would not fit; every drafter that holds memory on the target's devices lowers it."""
    try:
        plan, a = plan_of("llama-3.1-8b", tuple(drafters), tp, tokens=tokens, separate_drafter=apart)
    except DraftsimError as e:  # two draft models' heads that do not split, or nothing left for the KV cache
        assert "nothing is left for the KV cache" in str(e) or "does not divide" in str(e)
        return
    extra = {"bytes_in_kv_budget": graphs, "plan_note": "test"}
    entries = kvcache._engine_entries()
    saved = entries["vllm"]
    entries["vllm"] = {**saved, "cuda_graph_memory": extra}
    try:
        with_graphs = memory_plan(a.target, a.drafters, max_batched_tokens=tokens, separate_drafter=apart, engine=ENGINES["vllm"])
    except DraftsimError as e:
        assert "nothing is left for the KV cache" in str(e) and "CUDA graphs" in str(e)
        with_graphs = None
    finally:
        entries["vllm"] = saved
    for p in filter(None, (plan, with_graphs)):
        others = p.target_weights + p.drafter_weights + p.activations + p.graph_memory
        assert p.tokens * p.kv_bytes_per_token + others <= p.usable * (1 + 1e-12)
        assert p.used == pytest.approx(p.tokens * p.kv_bytes_per_token + others)
        assert (p.tokens + 1) * p.kv_bytes_per_token + others > p.usable
    if with_graphs is not None:
        assert with_graphs.tokens <= plan.tokens
    alone, _ = plan_of("llama-3.1-8b", (), tp, tokens=tokens)
    held = [d.memory() for d in a.drafters]
    on_device = [f for f in held if f.attached or not apart]
    assert plan.drafter_weights == pytest.approx(sum(f.weights for f in on_device))
    assert plan.drafter_kv_bytes_per_token == pytest.approx(sum(f.kv_per_token for f in on_device))
    assert plan.tokens <= alone.tokens
    if any(f.weights or f.kv_per_token for f in on_device):
        assert plan.tokens < alone.tokens


def test_every_cost_model_answers_the_one_interface():
    """memory() is the one question the plan asks: rooflines, heads, lookups and self-speculation
    know their bytes; linear costs do not (None)."""
    _, a = plan_of("llama-3.1-8b", ("eagle3", "selfspec:window=64", "ngram", "qwen2.5-0.5b"))
    for m in a.models:
        assert isinstance(m.memory(), MemoryFootprint)
    assert isinstance(a.drafters[0], HeadCost) and a.drafters[0].memory().kv_per_token > 0
    with pytest.raises(DraftsimError, match="finite number of bytes"):
        MemoryFootprint(weights=float("nan"))


def test_serve_sim_shows_every_term(capsys):
    args = ("serve-sim", "--target", "llama-3.1-8b", "--drafter-model", "eagle3", "--hardware", "h100-sxm", "--alpha", "0.8",
            "--qps", "2", "--requests", "10", "--output-len", "fixed:16", "--prompt-len", "fixed:32")
    status, out, err = run(capsys, *args)
    assert status == 0, err
    line = next(x for x in out.splitlines() if x.startswith("memory per device"))
    for words in ("target weights", "drafter weights", "activations", "CUDA graphs", "KV tokens", "drafter"):
        assert words in line
    status, out, err = run(capsys, *args, "--json")
    assert status == 0, err
    data = json.loads(out)
    memory = next(v for v in _walk(data) if isinstance(v, dict) and "drafter_kv_bytes_per_token" in v)
    assert memory["drafter_weights"] > 0 and memory["drafter_kv_bytes_per_token"] > 0
    assert {"target_weights", "activations", "graph_memory", "tokens", "target_kv_bytes_per_token"} <= set(memory)


def _walk(x):
    yield x
    if isinstance(x, dict):
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, list):
        for v in x:
            yield from _walk(v)
