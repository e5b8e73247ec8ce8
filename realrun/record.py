"""Recording traces: the target's output on each prompt, and every drafter's view of it.

For each prompt: the target generates its greedy output (and, with a seed, a sampled one);
one teacher-forced forward pass gives the target's distribution p at every output position;
each drafter's distribution q along the same text comes from :meth:`Drafter.predict_along`.
Per position and pair (drafter → target, and smaller drafter → larger neural drafter) the
trace keeps the draft's top token with its p and q, 1 − TV(p, q) over the whole vocabulary,
the greedy-match flag and both top-k lists; per forward call, the model, tokens and seconds.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass

import numpy as np

from ..sim.errors import DraftsimError
from ..sim.traces import TABLES, TraceWriter
from .drafters import Drafter, NeuralDraft, Rows, accept_prob
from .models import LoadedModel
from .prompts import Prompt, format_prompt

__all__ = ["record", "RecordStats"]


@dataclass
class RecordStats:
    prompts: int = 0
    skipped: int = 0
    output_tokens: int = 0
    seconds: float = 0.0


def _generate(target: LoadedModel, ids: list[int], max_new_tokens: int, seed: int | None) -> tuple[list[int], float]:
    import torch

    tok = target.tokenizer
    kw = {"do_sample": False} if seed is None else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    if seed is not None:
        torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(
            torch.tensor([ids], device=target.device),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=target.device),
            max_new_tokens=max_new_tokens,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            **kw,
        )
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def _pair_rows(prompt_id, mode, output, proposer, verifier, p: Rows, q: Rows, top_k) -> dict:
    """One (proposer, verifier) pair along the output: p is the verifier's dense view. Where
    the proposer proposes nothing the draft token is −1, with p, q, acceptance and match 0."""
    p_rows = p.dense
    draft = q.argmax()  # -1 where the drafter proposes nothing (n-gram / suffix lookup without a match)
    none = draft < 0
    v_top_ids, v_top_pr = p.top(top_k)
    d_top_ids, d_top_pr = q.top(top_k)
    n = len(output)
    target_argmax = output if verifier == "target" else p_rows.argmax(axis=1)
    return {
        "prompt_id": [prompt_id] * n,
        "mode": [mode] * n,
        "position": list(range(n)),
        "target_token": list(output),
        "proposer": [proposer] * n,
        "verifier": [verifier] * n,
        "draft_token": draft.tolist(),
        "p_draft": np.where(none, 0.0, p_rows[np.arange(n), np.maximum(draft, 0)]).tolist(),
        "q_draft": q.prob(draft).tolist(),
        "accept_prob": np.clip(accept_prob(p_rows, q), 0.0, 1.0).tolist(),
        "greedy_match": ((draft == np.asarray(target_argmax)) & ~none).tolist(),
        "draft_top_ids": d_top_ids,
        "draft_top_probs": d_top_pr,
        "verifier_top_ids": v_top_ids,
        "verifier_top_probs": v_top_pr,
    }


def _merge(tables: list[dict]) -> dict:
    out: dict = {}
    for t in tables:
        for k, v in t.items():
            out.setdefault(k, []).extend(v)
    return out


def record(
    target: LoadedModel,
    drafters: list[Drafter],
    prompts: list[Prompt],
    out,
    *,
    prompt_set: str,
    max_new_tokens: int = 128,
    top_k: int = 8,
    sample_seed: int | None = None,
    resume: bool = False,
    progress=None,
) -> RecordStats:
    """Record a trace of ``target`` and ``drafters`` over ``prompts`` into folder ``out``."""
    import torch
    import transformers

    names = [d.name for d in drafters]
    if len(set(names)) != len(names):
        raise DraftsimError(f"drafter names must be distinct; got {names}")
    for d in drafters:
        if d.neural and d.loaded.vocab_size != target.vocab_size:
            raise DraftsimError(f"drafter {d.name} has a vocabulary of {d.loaded.vocab_size}, the target {target.vocab_size}: they must share a tokenizer")
    modes = ["greedy"] + (["sampled"] if sample_seed is not None else [])
    metadata = {
        "target": target.describe(),
        "drafters": names,
        "drafter_kinds": {d.name: type(d).__name__ for d in drafters},
        "prompt_set": prompt_set,
        "max_new_tokens": max_new_tokens,
        "top_k": top_k,
        "modes": modes,
        "seed": sample_seed,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()},
        "device": target.device,
        "dtype": target.dtype,
        "host": platform.machine(),
    }
    writer = TraceWriter(out, metadata, resume=resume)
    target_view = NeuralDraft(target, "target")  # the target's own distributions along the text
    stats = RecordStats()
    t_start = time.perf_counter()
    for prompt in prompts:
        ids = format_prompt(prompt, target.tokenizer)
        for mode in modes:
            key = f"{prompt.set}/{prompt.id}/{mode}"
            if key in writer.done:
                stats.skipped += 1
                continue
            seed = None if mode == "greedy" else sample_seed + prompt.id
            output, t_gen = _generate(target, ids, max_new_tokens, seed)
            calls = [{"prompt_id": prompt.id, "mode": mode, "model": "target", "kind": "generate", "n_tokens": len(output), "seconds": t_gen}]
            tables = []
            if output:
                full = ids + output
                start = len(ids)
                views = {}
                for name, d in [("target", target_view)] + [(d.name, d) for d in drafters]:
                    t0 = time.perf_counter()
                    views[name] = d.predict_along(full, start)
                    calls.append({"prompt_id": prompt.id, "mode": mode, "model": name, "kind": "forward", "n_tokens": len(full), "seconds": time.perf_counter() - t0})
                for d in drafters:
                    tables.append(_pair_rows(prompt.id, mode, output, d.name, "target", views["target"], views[d.name], top_k))
                # Drafter-to-drafter pairs: each drafter verified by every earlier neural drafter.
                for i, big in enumerate(drafters):
                    if not big.neural:
                        continue
                    for small in drafters[i + 1 :]:
                        tables.append(_pair_rows(prompt.id, mode, output, small.name, big.name, views[big.name], views[small.name], top_k))
            positions = _merge(tables) if tables else {name: [] for name in TABLES["positions"].names}
            seq = {"prompt_set": [prompt.set], "prompt_id": [prompt.id], "split": [prompt.split], "mode": [mode],
                   "seed": [-1 if seed is None else seed], "prompt_ids": [ids], "output_ids": [output]}
            writer.commit(key, {"prompt_id": prompt.id, "set": prompt.set, "mode": mode, "output_tokens": len(output)},
                          {"sequences": seq, "positions": positions, "calls": _merge([{k: [v] for k, v in c.items()} for c in calls])})
            stats.prompts += 1
            stats.output_tokens += len(output)
            if progress is not None:
                progress(1)
    stats.seconds = time.perf_counter() - t_start
    return stats
