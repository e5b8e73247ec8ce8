"""Whole-step times of the operator model (``--cost-model operators``) beside the ``vllm`` roofline
entry, AIConfigurator's own estimate and published measurements (issue 37 item 1).

Run: ``.venv/bin/python benchmarks/bench_operators.py`` (needs the ``operators`` extra:
aiconfigurator-core 0.12.0). Prints, for Llama-3.1-8B on one H100 (decode, context 512, batch
1/16/64/128) and Llama-3.1-70B on four (batch 16):

* ``operators``: sim/cost/operators.py with the vllm engine's host time (1.21 ms per step) on top;
  ``ops GPU``: the same without the host time (the kernels alone);
* ``AIC``: AIConfigurator's own decode-step estimate from the same tables
  (``EngineHandle.decode_step_latency``, a private API of the pinned package, called here only,
  never by draftsim; skipped with a note if it fails);
* ``roofline``: the ``vllm`` engine entry on the catalog roofline (draftsim's default);
* ``published``: vLLM issue 20780's TPOT without speculation (benchmarks/published/vllm_issue20780.json:
  7.07 ms, batch 1, 128-token prompts and 256-token outputs, so a mean context near 256: both
  models are also priced at context 256 for it).

Then the 70B TP 4 ratio of a 4-token verification to a 1-token decode at batch 16 (issue 37's check:
1.0-1.2 decode steps), every difference over 10% with what causes it, and (``heads``) the drafting
heads' calls priced from the same tables beside the roofline's, with the 8B's 4-token verification
over its decode step at batch 1-64 under both (what moves a speedup with batch).

Last (alone with ``--holdout``), the operator model's fallback held out by model family (issue 37's
check: <= 10% median per operator kind): the efficiency curves of sim/cost/efficiency.py fitted on
the table rows that Llama and Qwen shapes use (at tp 1-8; a GEMM shape between measured widths
brings the widths around it) and scored on the rows of Gemma, SmolLM2, Mistral/Mixtral, DeepSeek,
GPT-OSS and GLM (no row in both), per kind and family, median and worst |predicted / measured - 1|,
for the vLLM tables of every GPU in SYSTEMS (H100 SXM, H200, A100, B200, GB200); the all-reduce (no model axis) held out by GPU count.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
from pathlib import Path

from draftsim.sim.cost import RooflineModel, default_catalog
from draftsim.sim.cost.assembly import Deployment, assemble
from draftsim.sim.cost.efficiency import FIT_FAMILIES, Roofs, family_holdout, fit_curves, gpu_count_holdout
from draftsim.sim.cost.operators import SYSTEMS, systems_root

ROOT = Path(__file__).resolve().parent
PUBLISHED = json.loads((ROOT / "published" / "vllm_issue20780.json").read_text())


def aic_decode_ms(hf_id: str, tp: int, batch: int, context: int) -> float | None:
    """AIConfigurator's own decode-step estimate (ms; kernels only) or None where its private API fails."""
    try:
        logging.disable(logging.WARNING)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from aiconfigurator_core.sdk.engine import EngineHandle

            handle = _HANDLES.get((hf_id, tp)) or EngineHandle.compile(hf_id, "h100_sxm", "vllm", tp_size=tp)
            _HANDLES[(hf_id, tp)] = handle
            return float(handle.decode_step_latency(batch, context, 2))
    except Exception as exc:  # noqa: BLE001 - a private API; the benchmark says so and goes on
        print(f"  (AIConfigurator's own estimate unavailable: {type(exc).__name__}: {str(exc)[:120]})")
        return None
    finally:
        logging.disable(logging.NOTSET)


_HANDLES: dict = {}


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holdout", action="store_true", help="only the efficiency curves held out by model family")
    if parser.parse_args().holdout:
        holdout()
        return
    ops8 = assemble(Deployment("llama-3.1-8b", "h100-sxm", overheads="vllm", cost_model="operators")).target
    roof8 = assemble(Deployment("llama-3.1-8b", "h100-sxm", overheads="vllm")).target
    host = ops8.overhead
    # the same roofline with each operator's max(memory, compute) in place of the engine's sum (forward_overlap 0)
    roof8_max = RooflineModel(roof8.model, roof8.hardware, overhead=roof8.overhead, graph_tokens=roof8.graph_tokens, overlap=1.0)
    rows, notes = [], []
    aic_known = {64: 8.8, 128: 10.5}  # issue 37's text, for comparison with what this run computes
    for batch, context in [(1, 256), (1, 512), (16, 512), (64, 512), (128, 512)]:
        ops = float(ops8.shape_time(batch, 1, context)) * 1e3
        gpu = ops - host * 1e3
        roof = float(roof8.shape_time(batch, 1, context)) * 1e3
        aic = aic_decode_ms("meta-llama/Meta-Llama-3.1-8B", 1, batch, context)
        pub = PUBLISHED["baseline_published_ms"] if (batch, context) == (1, 256) else None
        rows.append(("llama-3.1-8b", 1, batch, context, ops, gpu, aic, roof, pub))
        if aic is not None and abs(gpu / aic - 1) > 0.10:
            notes.append(f"8B batch {batch}: kernels {gpu:.2f} ms vs AIConfigurator {aic:.2f} ms ({gpu / aic - 1:+.0%})")
        if aic is not None and abs(ops / aic - 1) > 0.10:
            notes.append(f"8B batch {batch}, context {context}: operators {ops:.2f} ms vs AIConfigurator {aic:.2f} ms "
                         f"({ops / aic - 1:+.0%}): the engine's host step ({host * 1e3:.2f} ms, SpecDecode-Bench's fit of "
                         f"vLLM v0.10.1) is in ours, not in AIConfigurator's kernel sum; without it {gpu / aic - 1:+.1%}")
        if abs(roof / ops - 1) > 0.10:
            attn = {p.part: p.seconds for p in ops8.breakdown(batch, 1, context)}["attention"] * 1e3
            roof_attn = float(roof8.shape_time(batch, 1, context) - roof8.shape_time(batch, 1, 0)) * 1e3
            notes.append(f"8B batch {batch}, context {context}: vllm roofline {roof:.2f} ms vs operators {ops:.2f} ms "
                         f"({roof / ops - 1:+.0%}): the entry adds each operator's memory and compute time (forward_overlap 0, "
                         f"read from a fit at batch 1..64); with their max the same roofline gives "
                         f"{float(roof8_max.shape_time(batch, 1, context)) * 1e3:.2f} ms, so most of the gap is that sum on the GEMMs "
                         f"(its attention over the context: {roof_attn:.2f} ms, measured {attn:.2f} ms)")
        if pub is not None:
            for name, val in (("operators", ops), ("vllm roofline", roof)):
                if abs(val / pub - 1) > 0.10:
                    notes.append(f"8B batch 1: {name} {val:.2f} ms vs published {pub} ms ({val / pub - 1:+.0%})")
        if batch in aic_known and aic is not None and abs(aic / aic_known[batch] - 1) > 0.02:
            notes.append(f"AIConfigurator's estimate here ({aic:.2f} ms) differs from the issue's {aic_known[batch]} ms")
    ops70 = assemble(Deployment("llama-3.1-70b", "h100-sxm", tp=4, overheads="vllm", cost_model="operators")).target
    roof70 = assemble(Deployment("llama-3.1-70b", "h100-sxm", tp=4, overheads="vllm")).target
    none70 = assemble(Deployment("llama-3.1-70b", "h100-sxm", tp=4, overheads="none")).target
    o1, o4 = (float(ops70.shape_time(16, n, 512)) * 1e3 for n in (1, 4))
    r1, r4 = (float(roof70.shape_time(16, n, 512)) * 1e3 for n in (1, 4))
    n1, n4 = (float(none70.shape_time(16, n, 512)) * 1e3 for n in (1, 4))
    aic70 = aic_decode_ms("meta-llama/Meta-Llama-3.1-70B", 4, 16, 512)
    rows.append(("llama-3.1-70b", 4, 16, 512, o1, o1 - host * 1e3, aic70, r1, None))
    if aic70 is not None and abs((o1 - host * 1e3) / aic70 - 1) > 0.10:
        notes.append(f"70B TP 4 batch 16: kernels {o1 - host * 1e3:.2f} ms vs AIConfigurator {aic70:.2f} ms")

    print("decode step (ms): operators = measured kernels + the vllm engine's host step; ops GPU = kernels alone;")
    print("AIC = AIConfigurator 0.12.0's own estimate from the same tables (vLLM 0.24.0 kernels, H100 SXM)")
    head = ("model", "tp", "batch", "context", "operators", "ops GPU", "AIC", "vllm roofline", "published")
    print("  ".join(f"{h:>13}" for h in head))
    for r in rows:
        print("  ".join(f"{v:>13}" if isinstance(v, (str, int)) else f"{fmt(v):>13}" for v in r))
    print(f"\n70B TP 4, batch 16, context 512: a 4-token verification / a 1-token decode = operators {o4 / o1:.3f} "
          f"({o4:.2f} / {o1:.2f} ms), vllm roofline {r4 / r1:.3f}, bare roofline (engine none) {n4 / n1:.3f}; issue 37's check: 1.0-1.2")
    print("\nparts of the 8B step at batch 64, context 512 (operators):")
    for p in ops8.breakdown(64, 1, 512):
        print(f"  {p.part:<18} {p.seconds * 1e3:7.3f} ms  {p.basis:<9} {p.note}")
    print("\ndifferences over 10%:" if notes else "\nno difference over 10%")
    for n in notes:
        print(f"  - {n}")
    heads()
    holdout()


def holdout() -> None:
    """The efficiency curves held out by model family (and the all-reduce by GPU count)."""
    catalog = default_catalog()
    models = {}
    for name in catalog.models:
        try:
            models[name] = catalog.model(name)
        except Exception:  # noqa: BLE001 - the encoder-decoders the roofline refuses
            continue
    print(f"\nefficiency curves held out by model family: fitted on {'+'.join(FIT_FAMILIES)} rows, scored on the others' "
          "(|predicted / measured - 1|, median / worst; rows scored)")
    for hw_name, system in SYSTEMS.items():
        roofs = Roofs.of(catalog.hardware_spec(hw_name))
        scores = family_holdout(systems_root(), system, "vllm", roofs, models) + gpu_count_holdout(systems_root(), system, "vllm", roofs)
        curves = fit_curves(systems_root(), system, "vllm", roofs)
        print(f"\n{system} (vllm tables)")
        for line in curves.describe():
            print(f"  all rows: {line}")
        print("  " + "  ".join(f"{h:<18}" for h in ("kind", "held out", "rows", "median", "worst")))
        for sc in scores:
            print("  " + "  ".join([f"{sc.kind:<18}", f"{sc.held_out:<18}", f"{sc.rows:<18}", f"{sc.median:<18.1%}", f"{sc.worst:<18.0%}"]))
        pooled = {sc.kind: sc.median for sc in scores if sc.held_out == "all"}
        ar = [sc.median for sc in scores if sc.kind == "allreduce"]
        if ar:
            pooled["allreduce (worst GPU count)"] = max(ar)
        print("  goal <= 10% median per kind: " + ", ".join(f"{k} {v:.1%} {'ok' if v <= 0.10 else 'MISSED'}" for k, v in pooled.items()))


def heads() -> None:
    """Drafting heads on Llama-3.1-8B, one H100, context 512, vllm engine: a draft call (ms) and its
    cost coefficient c (over the target's 1-token call) from the operators and the roofline; then the
    target's 4-token verification over its 1-token step."""
    drafters = ("eagle", "eagle3", "medusa")
    ops = assemble(Deployment("llama-3.1-8b", "h100-sxm", drafters=drafters, overheads="vllm", cost_model="operators"))
    roof = assemble(Deployment("llama-3.1-8b", "h100-sxm", drafters=drafters, overheads="vllm"))
    bare = RooflineModel(roof.target.model, roof.target.hardware, overhead=roof.target.overhead, graph_tokens=roof.target.graph_tokens,
                         overlap=1.0)
    from draftsim.sim.cost.overheads import engine_overheads

    per_draft = engine_overheads("vllm").per_draft_forward * 1e3
    print(f"\ndrafting heads (context 512; ms per draft call with vLLM's {per_draft:.2f} ms per draft forward; c = over the target's "
          "1-token call):")
    print("  " + "  ".join(f"{h:>9}" for h in ("head", "batch", "operators", "c", "roofline", "c", "measured")))
    for i, name in enumerate(drafters):
        for batch in (1, 16, 64):
            o, r = (float(a.drafters[i].shape_time(batch, 1, 512)) for a in (ops, roof))
            to, tr = (float(a.target.shape_time(batch, 1, 512)) for a in (ops, roof))
            parts = ops.drafters[i].breakdown(batch, 1, 512)
            share = sum(p.seconds for p in parts if p.measured) / sum(p.seconds for p in parts if p.part != "host")
            print("  " + "  ".join([f"{name:>9}", f"{batch:>9}", f"{o * 1e3:>9.3f}", f"{o / to:>9.3f}", f"{r * 1e3:>9.3f}", f"{r / tr:>9.3f}",
                                    f"{share:>9.0%}"]))
    print("\n8B target, context 512: a 4-token verification / a 1-token step (vllm host on top; roofline max: each operator's "
          "max(memory, compute), the entry's sum replaced)")
    print("  " + "  ".join(f"{h:>13}" for h in ("batch", "operators", "vllm roofline", "roofline max")))
    for batch in (1, 8, 16, 32, 64):
        vals = [float(m.shape_time(batch, 4, 512) / m.shape_time(batch, 1, 512)) for m in (ops.target, roof.target, bare)]
        print("  " + "  ".join([f"{batch:>13}"] + [f"{v:>13.3f}" for v in vals]))


if __name__ == "__main__":
    main()
