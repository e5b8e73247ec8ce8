"""sim.cost: the cost interface, linear/profile/roofline backends, catalogs; draftsim cost/profile."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import run
from hypothesis import given
from hypothesis import strategies as st

from draftsim.sim import analytic
from draftsim.sim.cost import (
    BatchStats,
    CallCost,
    Costs,
    ProfileCost,
    RooflineModel,
    coefficient,
    default_catalog,
    fit_overhead,
    linear_fit,
    load_catalog,
    load_profile,
    model_from_hf_config,
)
from draftsim.sim.cost.catalog import write_catalog
from draftsim.sim.errors import DraftsimError

CAT = default_catalog()
GPU_PAIRS = [("llama-2-7b", "a100-80g"), ("llama-3-8b", "h100-sxm"), ("qwen2.5-0.5b", "l4"), ("gemma-2-9b", "h200"),
             ("smollm2-135m", "rtx-4090"), ("mistral-7b", "a10g")]


def roofline(model="llama-3-8b", hw="h100-sxm", **kw):
    return RooflineModel(CAT.model(model), CAT.hardware_spec(hw), kw.pop("dtype", "bfloat16"), **kw)


# -- the interface -------------------------------------------------------------------------------

def test_batch_stats_match_a_uniform_shape():
    a = BatchStats.of_batch([[3, 3, 3, 3]], [[100, 100, 100, 100]])
    b = BatchStats.of_shape(4, 3, 100)
    for f in ("sequences", "tokens", "cached", "pairs"):
        assert getattr(a, f)[0] == pytest.approx(getattr(b, f))
    assert b.pairs == 4 * 3 * (100 + 2)  # each new token attends to the cache and the new tokens up to itself


def test_padding_slots_are_absent_and_empty_calls_are_idle():
    r = roofline()
    t = r.forward_time([[2, 0, 0], [2, 2, 0], [0, 0, 0]], [[64, 9999, 9999], [64, 64, 0], [5, 5, 5]])
    assert t[0] == pytest.approx(float(r.shape_time(1, 2, 64)))
    assert t[1] == pytest.approx(float(r.shape_time(2, 2, 64)))
    assert t[2] == 0.0
    assert list(r.bound([[0, 0]], [[1, 1]])) == ["idle"]


@pytest.mark.parametrize("bad", [{"new_tokens": [[-1]]}, {"new_tokens": [[1.5]]}, {"new_tokens": [[1]], "context": [[-3]]}])
def test_bad_batches_are_refused(bad):
    with pytest.raises(DraftsimError):
        roofline().forward_time(**{"context": 0, **bad})


@pytest.mark.parametrize("shape", [(0, 1, 0), (1, 0, 0), (1, 1, -1), (2.5, 1, 0)])
def test_bad_shapes_are_refused(shape):
    with pytest.raises(DraftsimError):
        roofline().shape_time(*shape)


# -- linear: the old CallCost/Costs numbers ------------------------------------------------------

def test_linear_costs_have_one_home():
    """The linear costs live in sim.cost.linear alone (the old sim.costs shim is gone) and sim.cost
    exports the same classes."""
    import importlib

    import draftsim.sim.cost as cost

    assert cost.CallCost is CallCost and cost.Costs is Costs
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("draftsim.sim.costs")


@given(a=st.floats(0, 10), b=st.floats(0, 10), n=st.lists(st.integers(0, 50), min_size=1, max_size=6))
def test_linear_backend_gives_the_old_callcost_numbers(a, b, n):
    cc = CallCost(a, b)
    calls, tokens = int(sum(v > 0 for v in n)), sum(n)
    t = cc.forward_time([n], [[7] * len(n)])[0]
    expected = cc.time(1, tokens) if calls else 0.0  # one call over all the batch's tokens
    assert t == pytest.approx(expected)
    assert cc.single == a + b
    if a + b > 0:  # Costs.time is the old per-model sum of a·calls + b·tokens
        costs = Costs((cc, CallCost(b, a)))
        calls, toks = np.array([[3.0, 5.0]]), np.array([[7.0, 5.0]])
        assert costs.time(calls, toks)[0] == pytest.approx(3 * a + 7 * b + 5 * b + 5 * a)
        assert costs.coefficient.tolist() == pytest.approx([1.0, 1.0])


def test_costs_from_models_pins_the_one_token_call():
    costs = Costs.from_models([roofline("llama-2-70b", "a100-80g", tp=2), roofline("llama-2-7b", "a100-80g")], context=512)
    c = coefficient(roofline("llama-2-7b", "a100-80g"), roofline("llama-2-70b", "a100-80g", tp=2), context=512)
    assert costs.models[0].single == pytest.approx(1.0)
    assert costs.coefficient[1] == pytest.approx(float(c))


def test_linear_fit_recovers_a_line():
    fit = linear_fit(CallCost(0.3, 0.02), np.arange(1, 9))
    assert (fit.a, fit.b) == (pytest.approx(0.3), pytest.approx(0.02))


# -- roofline properties -------------------------------------------------------------------------

sizes = st.integers(1, 512)
contexts = st.integers(0, 8192)


@pytest.mark.parametrize("model,hw", GPU_PAIRS)
@given(b=sizes, n=sizes, c=contexts, db=st.integers(0, 64), dn=st.integers(0, 64), dc=st.integers(0, 4096))
def test_roofline_is_monotone_in_batch_tokens_and_context(model, hw, b, n, c, db, dn, dc):
    r = roofline(model, hw, check_memory=False)
    t = r.shape_time(b, n, c)
    assert r.shape_time(b + db, n, c) >= t
    assert r.shape_time(b, n + dn, c) >= t
    assert r.shape_time(b, n, c + dc) >= t


@pytest.mark.parametrize("model,hw", [("llama-2-70b", "a100-80g"), ("llama-3-8b", "h100-sxm"), ("qwen2.5-72b", "h200"), ("gemma-2-27b", "h100-sxm")])
@given(tp=st.sampled_from([1, 2, 4, 8]), b=sizes, n=st.integers(1, 64), c=contexts)
def test_tensor_parallel_is_never_faster_than_its_share_of_the_work(model, hw, tp, b, n, c):
    one = roofline(model, hw, check_memory=False)
    par = roofline(model, hw, tp=tp, check_memory=False)
    t1, tp_t = float(one.shape_time(b, n, c)), float(par.shape_time(b, n, c))
    assert tp_t * tp >= t1 * (1 - 1e-12)  # no super-linear speed-up: every device does at least 1/tp of the work
    assert tp_t >= float(par.with_overhead(0.0).shape_time(b, n, c)) - 1e-15


def test_roofline_is_the_weight_read_time_for_one_token_calls():
    r = roofline("llama-2-7b", "a100-80g")
    hw = CAT.hardware_spec("a100-80g")
    m = r.model  # every weight is read once, except the embedding table: one row per new token
    weights = (m.params - m.vocab * m.hidden) * 2 / (hw.memory_bandwidth * hw.mbu)
    assert float(r.shape_time(1, 1, 0)) == pytest.approx(weights, rel=0.01)
    assert r.shape_bound(1, 1, 0) == "memory"
    assert r.shape_bound(1024, 512, 0) == "compute"
    assert roofline("smollm2-135m", "h100-sxm", overhead=0.01).shape_bound(1, 1, 10) == "overhead"


def test_roofline_parts_sum_to_the_fast_path():
    r = roofline("qwen2.5-7b", "a10g", tp=2, check_memory=False)
    rng = np.random.default_rng(0)
    stats = BatchStats.of_shape(rng.integers(1, 300, 2000), rng.integers(1, 3000, 2000), rng.integers(0, 9000, 2000))
    mem, cmp, fixed = r._parts(stats)
    np.testing.assert_allclose(r.stats_time(stats), mem + cmp + fixed, rtol=1e-12)
    rng = np.random.default_rng(0)
    b, n, c = rng.integers(1, 300, 2000), rng.integers(1, 3000, 2000), rng.integers(0, 9000, 2000)
    np.testing.assert_allclose(r.shape_time(b, n, c), r.stats_time(BatchStats.of_shape(b, n, c)), rtol=1e-12)  # shape fast path
    assert r.shape_time([1, 2], 3, [[0], [9]]).shape == (2, 2) and np.ndim(r.shape_time(1, 1, 1)) == 0


def test_gqa_reads_less_kv_cache():
    dense = roofline("llama-2-7b", "a100-80g")
    gqa = roofline("mistral-7b", "a100-80g")
    extra = lambda r: float(r.shape_time(32, 1, 4096) - r.shape_time(32, 1, 0))  # noqa: E731
    assert extra(gqa) == pytest.approx(extra(dense) / 4, rel=0.05)  # 32 heads vs 8 KV heads


def test_a_model_that_does_not_fit_says_by_how_much():
    with pytest.raises(DraftsimError, match=r"138.0 GB of weights.*GB short"):
        roofline("llama-2-70b", "a100-80g")
    r = roofline("llama-2-70b", "a100-80g", tp=2)
    with pytest.raises(DraftsimError, match="KV cache"):
        r.check_fits(512, 8192)


def test_fit_overhead_recovers_a_known_overhead():
    r = roofline("smollm2-135m", "l4")
    truth = r.with_overhead(0.004)
    b, n, c = np.meshgrid([1, 2, 4], [1, 4, 16], [0, 512], indexing="ij")
    fitted = fit_overhead(r, b, n, c, truth.shape_time(b, n, c))
    assert fitted.overhead == pytest.approx(0.004, rel=1e-3)


# -- profiles ------------------------------------------------------------------------------------

def toy_profile(**kw):
    B, N, C = (1, 2, 4), (1, 2, 4, 8), (0, 128, 512)
    b, n, c = np.meshgrid(B, N, C, indexing="ij")
    seconds = 0.01 + 0.001 * b * n + 1e-6 * b * c
    fp = {"model": {"name": "toy", "dtype": "float32"}, "machine": {"cpu": "x", "cores": 2, "device": "cpu"}}
    return ProfileCost("toy", B, N, C, seconds, spread=seconds * 0.01, repeats=3, fingerprint=fp,
                       drafters={"maxgram": {"seconds_per_token": 1e-5}}, **kw), seconds


def test_the_last_row_table_prices_the_logit_rows_a_call_keeps(tmp_path):
    # toy_profile: 0.01 + 0.001·b·n + 1e-6·b·c; the same calls keeping one row save 0.0004 per other row
    N, C = (1, 2, 4, 8), (0, 128, 512)
    n_, c_ = np.meshgrid(N, C, indexing="ij")
    last = 0.01 + 0.001 * n_ + 1e-6 * c_ - 0.0004 * (n_ - 1)
    prof, seconds = toy_profile(last_row_seconds=last)
    b, n, c = 2, 8, 128
    full = float(prof.shape_time(b, n, c))
    assert float(prof.shape_time(b, n, c, rows=n)) == pytest.approx(full, rel=1e-12)  # every row: the measured call
    assert float(prof.row_saving(n, c)) == pytest.approx(0.0004, rel=1e-9)
    assert float(prof.shape_time(b, n, c, rows=1)) == pytest.approx(full - b * 7 * 0.0004, rel=1e-9)
    assert float(prof.shape_time(1, 1, c, rows=1)) == pytest.approx(float(prof.shape_time(1, 1, c)))  # nothing to drop
    r = np.arange(1, 9)
    assert (np.diff(prof.shape_time(b, n, c, rows=r)) >= 0).all()  # more rows never cost less
    # the cost interface: a batch that keeps one row per sequence (prefills) costs the same as rows=1
    stats = BatchStats.of_shape(b, n, c)
    one_row = BatchStats(stats.sequences, stats.tokens, stats.cached, stats.pairs, rows=stats.sequences)
    assert float(prof.stats_time(one_row)) == pytest.approx(float(prof.shape_time(b, n, c, rows=1)), rel=1e-12)
    assert float(prof.stats_time(stats)) == pytest.approx(full, rel=1e-12)
    prof.save(tmp_path / "h.json")
    back = load_profile(tmp_path / "h.json")
    assert np.array_equal(back.last_row_seconds, last)
    assert float(back.shape_time(b, n, c, rows=1)) == float(prof.shape_time(b, n, c, rows=1))
    plain, _ = toy_profile()  # no last-row table: rows are ignored (every row priced)
    assert float(plain.shape_time(b, n, c, rows=1)) == full
    for bad in (last[:2], last * np.nan, -last):
        with pytest.raises(DraftsimError, match="last_row_seconds"):
            toy_profile(last_row_seconds=bad)


def test_profile_hits_its_grid_points_and_round_trips(tmp_path):
    prof, seconds = toy_profile()
    b, n, c = np.meshgrid(prof.batch, prof.new_tokens, prof.context, indexing="ij")
    np.testing.assert_allclose(prof.shape_time(b, n, c), seconds, rtol=1e-12)
    np.testing.assert_allclose(prof.lookup(b * 1.0, n * 1.0, c * 1.0), seconds, rtol=1e-12)  # float path = table path
    prof.save(tmp_path / "p.json")
    back = load_profile(tmp_path / "p.json")
    assert back.monotone and not load_profile(tmp_path / "p.json", monotone=False).monotone
    assert (back.batch, back.new_tokens, back.context) == (prof.batch, prof.new_tokens, prof.context)
    np.testing.assert_array_equal(back.seconds, prof.seconds)
    assert back.fingerprint == prof.fingerprint and back.drafters == prof.drafters
    rng = np.random.default_rng(1)
    q = rng.integers(1, 5, 100), rng.integers(1, 9, 100), rng.integers(0, 513, 100)
    np.testing.assert_array_equal(back.shape_time(*q), prof.shape_time(*q))


@given(b=st.integers(1, 4), n=st.integers(1, 8), c=st.integers(0, 512), db=st.integers(0, 3), dn=st.integers(0, 7), dc=st.integers(0, 512))
def test_profile_interpolation_is_monotone_even_over_noisy_data(b, n, c, db, dn, dc):
    prof, seconds = toy_profile()
    noisy = ProfileCost("toy", prof.batch, prof.new_tokens, prof.context, seconds * np.random.default_rng(0).uniform(0.8, 1.2, seconds.shape))
    for p in (prof, noisy):
        t = p.shape_time(b, n, c)
        assert p.shape_time(min(b + db, 4), n, c) >= t * (1 - 1e-12)
        assert p.shape_time(b, min(n + dn, 8), c) >= t * (1 - 1e-12)
        assert p.shape_time(b, n, min(c + dc, 512)) >= t * (1 - 1e-12)


@given(b=st.sampled_from([1, 2, 4]), n=st.sampled_from([1, 2, 4, 8]), c=st.integers(0, 512), frac=st.floats(0, 1))
def test_profile_follows_an_affine_cost_in_context_exactly(b, n, c, frac):
    """A call's attention and KV reads grow linearly with its context: between context grid
    points the profile interpolates time linearly, so an affine t(c) is priced exactly (at
    integer and fractional contexts, table and float paths alike), and between batch and
    new-token grid points power laws stay exact."""
    prof, seconds = toy_profile()  # 0.01 + 0.001·b·n + 1e-6·b·c: affine in c
    x = c + frac * (c < 512)
    assert float(prof.shape_time(b, n, c)) == pytest.approx(0.01 + 0.001 * b * n + 1e-6 * b * c, rel=1e-12)
    assert float(prof.lookup(float(b), float(n), x)) == pytest.approx(0.01 + 0.001 * b * n + 1e-6 * b * x, rel=1e-12)
    B, N, C = (1, 4), (1, 8), (0, 256)
    bb, nn, cc = np.meshgrid(B, N, C, indexing="ij")
    power = ProfileCost("p", B, N, C, 0.02 * bb**0.7 * nn**0.4 * (1 + cc / 256))
    bi, ni = (1 + 3 * frac), (1 + 7 * frac)
    assert float(power.lookup(bi, ni, 0.0)) == pytest.approx(0.02 * bi**0.7 * ni**0.4, rel=1e-9)


def test_a_profile_can_keep_its_medians_as_measured():
    """On a CPU a forward of 16 token rows can cost less than one of 12 (the GEMM library
    switches kernels): by default the profile lifts such a dip to the running maximum, with
    ``monotone=False`` (what check-serve prices with) every grid point answers its median."""
    B, N, C = (1, 2, 3, 4), (4,), (0, 128)
    t = np.array([[[0.08, 0.09]], [[0.11, 0.12]], [[0.14, 0.15]], [[0.12, 0.13]]])  # 16 rows cheaper than 12
    lifted, raw = ProfileCost("m", B, N, C, t), ProfileCost("m", B, N, C, t, monotone=False)
    assert float(lifted.shape_time(4, 4, 0)) == pytest.approx(0.14) and float(raw.shape_time(4, 4, 0)) == pytest.approx(0.12)
    b, n, c = np.meshgrid(B, N, C, indexing="ij")
    np.testing.assert_allclose(raw.shape_time(b, n, c), t, rtol=1e-12)
    np.testing.assert_allclose(raw.lookup(b * 1.0, n * 1.0, c * 1.0), t, rtol=1e-12)
    assert float(raw.lookup(3.5, 4.0, 64.0)) < float(lifted.lookup(3.5, 4.0, 64.0))


def test_profile_refuses_or_flags_shapes_outside_its_grid():
    prof, _ = toy_profile()
    with pytest.raises(DraftsimError, match=r"batch 8 is outside the profile's grid \[1, 4\]"):
        prof.shape_time(8, 1, 0)
    with pytest.raises(DraftsimError, match="context 650"):
        prof.forward_time([[1, 1]], [[600, 700]])  # priced at the mean context, 650
    clamp, _ = toy_profile(extrapolate="clamp")
    assert clamp.shape_time(8, 1, 0) == pytest.approx(float(clamp.shape_time(4, 1, 0)))
    assert clamp.outside([1, 8], 1, 0).tolist() == [False, True]


def test_ragged_batch_is_priced_at_its_means():
    prof, _ = toy_profile()
    assert prof.forward_time([[2, 2, 0]], [[128, 128, 0]])[0] == pytest.approx(float(prof.shape_time(2, 2, 128)))


def test_profile_fingerprint_and_bad_files(tmp_path):
    prof, _ = toy_profile()
    prof.check_fingerprint(machine={"cpu": "x"})
    with pytest.raises(DraftsimError, match="another machine: cpu"):
        prof.check_fingerprint(machine={"cpu": "y"})
    path = tmp_path / "p.json"
    prof.save(path)
    doc = json.loads(path.read_text())
    for change, msg in (({"version": 99}, "version 99"), ({"schema": "x"}, "not a draftsim cost profile"),
                        ({"seconds": [[[1.0]]]}, "shape"), ({"batch": [2, 1, 4]}, "strictly increasing")):
        path.write_text(json.dumps({**doc, **change}))
        with pytest.raises(DraftsimError, match=msg):
            load_profile(path)
    path.write_text("{")
    with pytest.raises(DraftsimError, match="not a valid profile"):
        load_profile(path)


# -- catalogs ------------------------------------------------------------------------------------

def test_shipped_catalog_is_complete_and_cited():
    CAT.validate()
    for name in ["h100-sxm", "h200", "a100-80g", "a100-40g", "l4", "a10g", "rtx-4090", "local-cpu"]:
        assert CAT.hardware[name]["source"]
    for name in ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-0.5b",
                 "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b", "gemma-2-2b", "gemma-2-9b",
                 "gemma-2-27b", "smollm2-135m", "smollm2-360m", "smollm2-1.7b", "mistral-7b"]:
        assert "huggingface.co" in CAT.model(name).source
    # parameter counts as the model cards state them
    assert CAT.model("llama-2-7b").params == pytest.approx(6.74e9, rel=0.01)
    assert CAT.model("llama-3-70b").params == pytest.approx(70.6e9, rel=0.01)
    assert CAT.model("qwen2.5-7b").params == pytest.approx(7.6e9, rel=0.02)
    assert CAT.model("smollm2").params == pytest.approx(134.5e6, rel=0.01)  # the embedded model: 134,515,008 weights
    with pytest.raises(DraftsimError, match="encoder-decoder"):
        CAT.model("flan-t5-xxl")


def test_unknown_names_list_the_known_ones():
    with pytest.raises(DraftsimError, match=r"unknown model 'llama-9'; did you mean llama-3-8b or .* known: .*llama-2-7b"):
        CAT.model("llama-9")
    with pytest.raises(DraftsimError, match=r"unknown hardware 'tpu'; known: .*h100-sxm"):
        CAT.hardware_spec("tpu")


def test_hf_config_read_directly(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
           "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 8192}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    spec = model_from_hf_config(tmp_path / "m")
    assert spec.params == CAT.model("smollm2-135m").params and spec.head_dim == 64
    del cfg["intermediate_size"], cfg["vocab_size"]
    (tmp_path / "bad.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftsimError, match="missing field.*intermediate_size, vocab_size"):
        CAT.model(str(tmp_path / "bad.json"))
    (tmp_path / "t5.json").write_text(json.dumps({"is_encoder_decoder": True, "model_type": "t5"}))
    with pytest.raises(DraftsimError, match="encoder-decoder"):
        model_from_hf_config(tmp_path / "t5.json")


def test_user_catalog_round_trip_and_validation(tmp_path):
    hw = CAT.hardware_spec("l4")
    write_catalog(tmp_path / "hw.json", hardware={"my-l4": hw})
    back = load_catalog(tmp_path / "hw.json").hardware_spec("my-l4")
    assert back.memory_bandwidth == pytest.approx(hw.memory_bandwidth) and back.peak("bfloat16") == pytest.approx(hw.peak("bfloat16"))
    doc = json.loads((tmp_path / "hw.json").read_text())
    del doc["hardware"]["my-l4"]["memory_gb"]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(DraftsimError, match="missing field.*memory_gb"):
        load_catalog(tmp_path / "bad.json")
    doc = {"schema": "draftsim.models", "version": 1, "models": {"m": {"layers": 2, "hidden": 64, "intermediate": 128, "heads": 4,
                                                                          "vocab": 100, "source": "test", "kv_heads": 3}}}
    (tmp_path / "m.json").write_text(json.dumps(doc))
    with pytest.raises(DraftsimError, match="multiple of kv_heads"):
        load_catalog(tmp_path / "m.json")


# -- the CLI -------------------------------------------------------------------------------------

def test_cost_json_one_record_per_model_and_shape(capsys):
    status, out, err = run(capsys, "cost", "--target", "llama-2-70b", "--drafter", "llama-2-7b", "--drafter", "maxgram", "--hardware",
                           "a100-80g", "--tp", "2", "--batch", "1,8", "--new-tokens", "1,5", "--context", "512", "--json")
    assert status == 0 and err == ""
    data = json.loads(out)
    recs = data["records"]
    assert len(recs) == 3 * 2 * 2 * 1
    assert {(r["model"], r["batch"], r["new_tokens"]) for r in recs} >= {("llama-2-7b", 8, 5), ("maxgram", 1, 1)}
    assert all(r["bound"] in ("memory", "compute", "overhead") for r in recs)
    t1 = next(r for r in recs if r["model"] == "llama-2-70b" and r["batch"] == 1 and r["new_tokens"] == 1)
    assert t1["c"] == pytest.approx(1.0) and 0.02 < t1["seconds"] < 0.2


def test_cost_text_and_list(capsys):
    status, out, _ = run(capsys, "cost", "--target", "llama-3-8b", "--drafter", "smollm2-135m", "--hardware", "h100")
    assert status == 0 and "llama-3-8b" in out and "memory" in out
    status, out, _ = run(capsys, "cost", "--list")
    assert status == 0 and "qwen2.5-72b" in out and "rtx-4090" in out and "unsupported" in out


@pytest.mark.parametrize("argv,msg", [
    (["--target", "llama-9", "--hardware", "h100"], "unknown model 'llama-9'; did you mean"),
    (["--target", "llama-2-7b", "--hardware", "tpu-v9"], "unknown hardware 'tpu-v9'; known:"),
    (["--target", "llama-2-70b", "--hardware", "a100-80g"], "GB short"),
    (["--target", "llama-2-7b", "--hardware", "l4", "--batch", "64", "--context", "4096"], "KV cache"),
    (["--target", "llama-2-7b", "--hardware", "l4", "--batch", "0"], "batch must be an integer >= 1"),
    (["--target", "llama-2-7b", "--hardware", "l4", "--new-tokens", "-2"], "new_tokens must be an integer >= 1"),
    (["--target", "flan-t5-xxl", "--hardware", "a100-80g"], "encoder-decoder"),
    (["--target", "llama-2-7b"], "--hardware"),
])
def test_cost_bad_input_is_one_line_exit_2(capsys, argv, msg):
    status, out, err = run(capsys, "cost", *argv)
    assert status == 2 and out == ""
    assert msg in err and len(err.strip().splitlines()) == 1


def test_cost_with_profile_checks_model_and_machine(capsys, tmp_path):
    from draftsim.realrun.profiling import machine_fingerprint

    prof, _ = toy_profile()
    prof.fingerprint["machine"] = machine_fingerprint("cpu")
    prof.model = "smollm2"
    prof.save(tmp_path / "p.json")
    status, out, err = run(capsys, "cost", "--target", "smollm2", "--drafter", "maxgram", "--hardware", "local-cpu", "--dtype", "float32",
                           "--profile", str(tmp_path / "p.json"), "--batch", "1,4", "--new-tokens", "1,8", "--context", "128", "--json")
    assert status == 0, err
    recs = json.loads(out)["records"]
    assert recs[0]["seconds"] == pytest.approx(float(prof.shape_time(1, 1, 128)))
    assert any(r["model"] == "maxgram" and r["seconds"] == pytest.approx(1e-5 * r["batch"] * r["new_tokens"]) for r in recs)
    for argv, msg in ((["--hardware", "h100"], "not on h100-sxm"), (["--batch", "16"], "outside the profile's grid"),
                      (["--target", "smollm2-360m"], "neither the target nor a drafter")):
        base = {"--target": "smollm2", "--hardware": "local-cpu", "--batch": "1"}
        base.update(dict(zip(argv[::2], argv[1::2])))
        flat = [x for kv in base.items() for x in kv]
        status, out, err = run(capsys, "cost", *flat, "--dtype", "float32", "--profile", str(tmp_path / "p.json"))
        assert status == 2 and msg in err, (argv, err)
    prof.fingerprint["machine"]["cpu"] = "another CPU"
    prof.save(tmp_path / "q.json")
    status, _, err = run(capsys, "cost", "--target", "smollm2", "--hardware", "local-cpu", "--dtype", "float32", "--profile", str(tmp_path / "q.json"))
    assert status == 2 and "another machine" in err


def test_profile_command_on_a_tiny_model(capsys, tmp_path):
    out_path = tmp_path / "tiny.json"
    status, out, err = run(capsys, "profile", "--model", "tiny:1", "--batch", "1,2", "--new-tokens", "1,3", "--context", "0,8",
                           "--repeats", "2", "--out", str(out_path), "--json")
    assert status == 0, err
    data = json.loads(out)
    assert len(data["points"]) == 8 and set(data["drafters"]) == {"maxgram", "bigram", "ngram", "suffix"}
    prof = load_profile(out_path)
    assert prof.model == "tiny:1" and prof.fingerprint["model"]["architecture"].startswith("2x64")
    mono = prof.seconds
    for ax in range(3):  # grid points answer their measured medians, made non-decreasing along each axis
        mono = np.maximum.accumulate(mono, axis=ax)
    assert (prof.seconds > 0).all() and prof.shape_time(2, 3, 8) == pytest.approx(float(mono[1, 1, 1]))
    assert prof.last_row_seconds.shape == (2, 2) and (prof.last_row_seconds > 0).all()  # batch 1 again, keeping the last row


def test_profile_bad_input_writes_nothing(capsys, tmp_path):
    for argv, msg in ((["--batch", "0"], "batch must be an integer >= 1"), (["--drafters", "oracle"], "--drafters knows"),
                      (["--out", str(tmp_path / "missing" / "p.json")], "does not exist"), (["--path", "engine"], "invalid choice: 'engine'")):
        base = {"--model": "tiny:1", "--out": str(tmp_path / "p.json")}
        base.update(dict(zip(argv[::2], argv[1::2])))
        status, _, err = run(capsys, "profile", *[x for kv in base.items() for x in kv])
        assert status == 2 and msg in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


# -- validation against published GPU measurements (benchmarks/validate_costs.py prints them all) --

@pytest.mark.parametrize("model,tp,tokens_per_s,tolerance", [
    ("llama-2-7b", 1, 104.9, 0.10), ("llama-2-70b", 2, 21.32, 0.10), ("llama-2-70b", 4, 38.01, 0.10), ("llama-2-70b", 8, 62.50, 0.20),
])
def test_roofline_matches_gpt_fast_on_a100(model, tp, tokens_per_s, tolerance):
    """gpt-fast README: batch 1, bf16, compiled, A100-80GB (330 W); the catalog's default efficiencies."""
    r = roofline(model, "a100-80g", tp=tp)
    assert float(r.shape_time(1, 1, 5)) == pytest.approx(1 / tokens_per_s, rel=tolerance)


def test_roofline_predicts_specdec_70b_from_an_overhead_fitted_on_7b():
    """SpecDec++ App. D.2: t = 0.0207 s (7B, one A100-80G) and 0.108 s (70B over two, layer-sharded)."""
    r7 = roofline("llama-2-7b", "a100-80g")
    per_layer = (0.0207 - float(r7.shape_time(1, 1, 256))) / 32
    r70 = roofline("llama-2-70b", "a100-80g", pp=2).with_overhead(0.0, per_layer)
    assert float(r70.shape_time(1, 1, 256)) == pytest.approx(0.108, rel=0.2)


def test_cost_refuses_a_profile_of_another_architecture(capsys, tmp_path):
    from draftsim.realrun.profiling import machine_fingerprint

    prof, _ = toy_profile()
    prof.model = "smollm2"
    prof.fingerprint = {"model": {"name": "smollm2", "architecture": "2x64/128 h4/2x16 v100"}, "machine": machine_fingerprint("cpu")}
    prof.save(tmp_path / "p.json")
    status, _, err = run(capsys, "cost", "--target", "smollm2", "--hardware", "local-cpu", "--dtype", "float32", "--profile", str(tmp_path / "p.json"))
    assert status == 2 and "another model: architecture 2x64/128" in err


# -- the planning commands take the same model/hardware options --------------------------------

HW = ["--target", "llama-2-70b", "--hardware", "a100-80g", "--tp", "2", "--engine", "none"]  # the bare roofline


def test_ewif_from_hardware_uses_the_roofline_coefficient(capsys):
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", *HW, "--drafter-model", "llama-2-7b", "--cost-context", "256", "--json")
    assert status == 0, err
    data = json.loads(out)
    # the draft model runs at the target's TP by default (as vLLM runs it) ...
    c = coefficient(roofline("llama-2-7b", "a100-80g", tp=2), roofline("llama-2-70b", "a100-80g", tp=2), context=256)
    assert data["cost"] == pytest.approx(float(c)) and data["cost_from"]["hardware"] == "a100-80g"
    # ... and on its own devices when told
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", *HW, "--drafter-model", "llama-2-7b", "--drafter-tp", "1", "--cost-context", "256",
                           "--json")
    c = coefficient(roofline("llama-2-7b", "a100-80g"), roofline("llama-2-70b", "a100-80g", tp=2), context=256)
    assert status == 0 and json.loads(out)["cost"] == pytest.approx(float(c))
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", "--cost", "0.1", *HW, "--drafter-model", "llama-2-7b")
    assert status == 2 and "not both" in err


def test_plan_simulate_optimize_from_hardware(capsys):
    status, out, err = run(capsys, "plan", "--drafter", "big:0.8:llama-2-7b", "--drafter", "tiny:0.5:0.0", *HW, "--json")
    assert status == 0, err
    drafters = json.loads(out)["drafters"]
    assert drafters[0]["cost"] == pytest.approx(json.loads(out)["cost_from"]["coefficients"][0]) and drafters[1]["cost"] == 0.0
    status, out, err = run(capsys, "simulate", "--policy", "fixed:k=3", "--alpha", "0.8", *HW, "--drafter-model", "llama-2-7b", "--tokens", "2000", "--json")
    assert status == 0, err
    status, out, err = run(capsys, "optimize", "kmatrix", "--alpha", "0.7", *HW, "--drafter-model", "llama-2-7b", "--drafter-model", "maxgram",
                           "--k-max", "4", "--json")
    assert status == 0, err
    assert json.loads(out)["costs"][2] == 0.0
    status, out, err = run(capsys, "optimize", "tree", "--rank-alphas", "0.7,0.2", "--budget", "8", *HW, "--drafter-model", "llama-2-7b", "--json")
    assert status == 0, err
    status, _, err = run(capsys, "simulate", "--policy", "fixed:k=3", "--alpha", "0.8", "--target", "llama-2-70b", "--hardware", "a100-80g",
                         "--drafter-model", "llama-2-7b")
    assert status == 2 and "GB short" in err


def test_planning_from_hardware_prices_the_targets_verification(capsys):
    status, out, err = run(capsys, "ewif", "--alpha", "0.8", *HW, "--drafter-model", "llama-2-7b", "--cost-context", "256", "--k-max", "8", "--json")
    assert status == 0, err
    data = json.loads(out)
    target = roofline("llama-2-70b", "a100-80g", tp=2)
    t = np.array([float(target.shape_time(1, n, 256)) for n in range(1, 10)])
    assert data["cost_from"]["verify"] == pytest.approx((t / t[0]).tolist(), rel=1e-9)
    for row in data["rows"]:
        k = row["k"]
        assert row["ewif"] == pytest.approx(float(analytic.expected_tokens(0.8, k)) / (data["cost"] * k + t[k] / t[0]), rel=1e-9)
    best = max(data["rows"], key=lambda r: r["ewif"])
    assert data["best"]["k"] == best["k"] and best["best"]
    status, out, err = run(capsys, "plan", "--drafter", "big:0.8:llama-2-7b", *HW, "--k-max", "8", "--cost-context", "256", "--json")
    assert status == 0, err
    sd = [s for s in json.loads(out)["strategies"] if s["kind"] == "sd"][0]
    assert sd["k"] == data["best"]["k"] and sd["ewif"] == pytest.approx(data["best"]["ewif"], rel=1e-9)


def test_planning_with_a_profile_stops_where_its_grid_does(capsys, tmp_path):
    from draftsim.realrun.profiling import machine_fingerprint

    prof, _ = toy_profile()  # new tokens up to 8
    prof.fingerprint["machine"] = machine_fingerprint("cpu")
    prof.save(tmp_path / "p.json")
    status, out, err = run(capsys, "ewif", "--alpha", "0.9", "--target", prof.model, "--drafter-model", prof.model, "--hardware", "local-cpu",
                           "--profile", str(tmp_path / "p.json"), "--dtype", prof.dtype, "--cost-batch", "2", "--cost-context", "128", "--json")
    assert status == 0, err
    data = json.loads(out)
    assert len(data["cost_from"]["verify"]) == 8 and [r["k"] for r in data["rows"]] == list(range(8))
    status, _, err = run(capsys, "ewif", "--alpha", "0.9", "--k", "9", "--target", prof.model, "--drafter-model", prof.model, "--hardware", "local-cpu",
                         "--profile", str(tmp_path / "p.json"), "--dtype", prof.dtype, "--cost-batch", "2", "--cost-context", "128")
    assert status == 2 and "drafts up to 7 tokens" in err and err.count("\n") == 1


def test_costs_from_a_profile_stay_inside_its_grid():
    prof, _ = toy_profile()  # new tokens up to 8
    costs = Costs.from_models([prof, CallCost(0.001)], batch=2, context=128)
    assert costs.models[0].single == pytest.approx(1.0)
    assert costs.models[0].a + 8 * costs.models[0].b == pytest.approx(float(prof.shape_time(2, 8, 128) / prof.shape_time(2, 1, 128)), rel=0.05)  # linear at grid points, log-interpolated between
