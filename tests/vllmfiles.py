"""``vllm bench serve --save-result --save-detailed`` files written the way vLLM writes them, for
the reader tests (tests/test_readers.py, tests/test_fuzz.py).

The layout follows ``vllm/benchmarks/serve.py`` (009e6d4a): ``main()`` writes the setup
(``date``, ``backend``, ``model_id``, ``num_prompts``, ``request_rate`` — ``"inf"`` when
unlimited —, ``burstiness``, ``max_concurrency``) and merges ``benchmark()``'s result: ``duration``,
``completed``, ``failed``, totals and throughputs, one entry per request *sent* in ``input_lens``,
``output_lens`` (0 for a failed request), ``ttfts``, ``itls``, ``latencies``, ``start_times``,
``queue_times``, ``generated_texts``, ``errors`` (non-empty for a failed request: a failed
``RequestFuncOutput`` keeps ``ttft`` 0.0, ``itl`` [], ``latency`` 0.0), then the
``{mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms`` metrics; without ``--save-detailed`` the
per-request fields ``input_lens``, ``output_lens``, ``start_times``, ``ttfts``, ``itls``,
``generated_texts`` and ``errors`` are removed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def vllm_doc(n: int = 20, failed: int = 0, rate=2.0, max_concurrency=None, prompt=256, output=128, itl_s: float = 0.008,
             ttft_s: float = 0.03, detailed: bool = True, start_times: bool = True, seed: int = 0) -> dict:
    """A result of ``n`` successful and ``failed`` failed requests (failures spread among them),
    prompts of ``prompt`` tokens (an int or a list cycled), outputs of ``output`` tokens, sent at
    ``rate`` (0.5 s apart in ``start_times``), every token ``itl_s`` after the last."""
    rng = np.random.default_rng(seed)
    sent = n + failed
    ok = np.ones(sent, dtype=bool)
    if failed:
        ok[rng.choice(sent, failed, replace=False)] = False
    prompts = [prompt[i % len(prompt)] for i in range(sent)] if isinstance(prompt, list) else [prompt] * sent
    outs = [output if good else 0 for good in ok]
    ttfts = [ttft_s if good else 0.0 for good in ok]
    itls = [[itl_s] * (o - 1) if good else [] for good, o in zip(ok, outs)]
    lat = [t + sum(g) if good else 0.0 for good, t, g in zip(ok, ttfts, itls)]
    gap = 0.5 if rate == "inf" else 1.0 / float(rate)
    starts = [1000.0 + gap * i for i in range(sent)]
    duration = max(starts) - min(starts) + max(lat) + 0.1
    total_out = sum(outs)
    doc = {"date": "20250101-120000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
           "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": sent,
           "request_rate": rate, "burstiness": 1.0, "max_concurrency": max_concurrency,
           "duration": duration, "completed": n, "failed": failed, "total_input_tokens": sum(p for p, g in zip(prompts, ok) if g),
           "total_output_tokens": total_out, "request_throughput": n / duration, "request_goodput": None,
           "output_throughput": total_out / duration, "total_token_throughput": (total_out + sum(prompts)) / duration,
           "input_lens": prompts, "output_lens": outs, "ttfts": ttfts, "itls": itls, "latencies": lat, "start_times": starts,
           "queue_times": [0.0] * sent, "generated_texts": ["text" if g else "" for g in ok],
           "errors": ["" if g else "Traceback (most recent call last): aiohttp.ClientError" for g in ok],
           "max_output_tokens_per_s": 1.0, "max_concurrent_requests": 1, "rtfx": 0.0}
    gaps = itl_s * 1e3 if output > 1 else 0.0  # one-token outputs: no TPOT, no gaps (vLLM writes 0 for an empty list)
    ms = {"ttft": ttft_s * 1e3, "tpot": gaps, "itl": gaps, "e2el": (ttft_s + (output - 1) * itl_s) * 1e3}
    for metric, value in ms.items():
        for stat in ("mean", "median", "p99"):
            doc[f"{stat}_{metric}_ms"] = value
        doc[f"std_{metric}_ms"] = 0.0
    if not start_times:
        doc.pop("start_times")
    if not detailed:
        for key in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"):
            doc.pop(key, None)
    return doc


def write_vllm(path, doc: dict | None = None, **kwargs) -> Path:
    """``doc`` (default :func:`vllm_doc` of ``kwargs``) written as ``json.dump`` writes it."""
    path = Path(path)
    path.write_text(json.dumps(vllm_doc(**kwargs) if doc is None else doc))
    return path
