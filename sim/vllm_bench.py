"""``vllm bench serve --save-result`` files: a run's workload and what it measured.

The layout is vLLM's (``vllm/benchmarks/serve.py`` at 009e6d4a; older ``benchmarks/benchmark_serving.py``
files share it; docs/research/acceptance.json lists the fields): setup fields (``model_id``,
``num_prompts``, ``request_rate`` — the string ``"inf"`` when unlimited —, ``max_concurrency``),
results (``duration`` s, ``completed``, ``total_input_tokens``, ``total_output_tokens``,
``request_throughput``, ``output_throughput``, ``mean_ttft_ms``, ``median_ttft_ms``,
``mean_tpot_ms``, ``median_itl_ms``, ...), and with ``--save-detailed`` per request
``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (lists of gaps, s) and, in newer
versions, ``start_times``. Field sets change across versions: every field is read defensively
and checked on read, one line naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from .errors import DraftsimError
from .files import read_text

__all__ = ["VllmBench", "read_vllm_bench", "MAX_BYTES"]

#: The largest result file read (a detailed result of 100k requests is ~50 MB).
MAX_BYTES = 256 * 2**20


@dataclass(frozen=True)
class VllmBench:
    """A ``vllm bench serve`` result: its setup, per-request arrays (when saved) and headline
    metrics (seconds)."""

    source: str
    model: str | None
    request_rate: float  #: requests/s (inf: all at once)
    max_concurrency: int | None
    duration: float
    completed: int
    input_lens: np.ndarray | None
    output_lens: np.ndarray | None
    ttfts: np.ndarray | None
    itls: list | None
    start_times: np.ndarray | None
    metrics: dict  #: the file's *_ms metrics in seconds, e.g. "median_ttft", "mean_tpot", "p99_itl"
    spec_rates: tuple | None = None  #: spec_decode_per_position_acceptance_rates (cumulative, vLLM's) when the run speculated

    @property
    def detailed(self) -> bool:
        return self.input_lens is not None and self.output_lens is not None

    def mean_concurrency(self) -> float:
        """Requests in flight on average (Little's law: throughput × mean latency), for the
        decode batch a plain run's ITL was measured at."""
        e2e = self.metrics.get("mean_e2el")
        if e2e is None:
            tpot, ttft = self.metrics.get("mean_tpot"), self.metrics.get("mean_ttft")
            out = self.output_lens.mean() if self.output_lens is not None else None
            if tpot is None or ttft is None or out is None:
                raise DraftsimError(f"{self.source}: the mean concurrency needs mean_e2el_ms, or mean_ttft_ms, mean_tpot_ms and output_lens")
            e2e = ttft + tpot * (out - 1)
        return self.completed / self.duration * e2e


def _number(doc: dict, key: str, source: str, required: bool = True):
    if key not in doc or doc[key] is None:
        if required:
            raise DraftsimError(f"{source}: field {key} is missing (a vllm bench serve --save-result file has it)")
        return None
    v = doc[key]
    if isinstance(v, str) and v.strip().lower() == "inf":
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) and v != math.inf or v < 0:
        raise DraftsimError(f"{source}: field {key} must be a number >= 0; got {json.dumps(v)[:40]}")
    return float(v)


def _array(doc: dict, key: str, source: str, n: int | None):
    if key not in doc or doc[key] is None:
        return None
    v = doc[key]
    if not isinstance(v, list) or (n is not None and len(v) != n):
        raise DraftsimError(f"{source}: field {key} must be a list of {n if n is not None else 'the'} per-request values")
    try:
        arr = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        raise DraftsimError(f"{source}: field {key} must hold numbers") from None
    if arr.ndim != 1 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise DraftsimError(f"{source}: field {key} must hold finite numbers >= 0")
    return arr


def read_vllm_bench(path) -> VllmBench:
    """Read and check a ``vllm bench serve --save-result`` JSON file."""
    source = f"vllm result {path}"
    try:
        doc = json.loads(read_text(path, "vllm result", MAX_BYTES, fifo=False))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise DraftsimError(f"{source} is not valid JSON ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(doc, dict):
        raise DraftsimError(f"{source}: a result file is a JSON object")
    completed = _number(doc, "completed", source)
    if completed < 1 or completed != int(completed):
        raise DraftsimError(f"{source}: field completed must be a whole number >= 1; got {completed:g}")
    n = int(completed)
    duration = _number(doc, "duration", source)
    if duration <= 0:
        raise DraftsimError(f"{source}: field duration must be > 0")
    rate = _number(doc, "request_rate", source, required=False)
    conc = _number(doc, "max_concurrency", source, required=False)
    metrics = {}
    for key, value in doc.items():
        if key.endswith("_ms") and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            metrics[key[:-3]] = float(value) / 1e3
    itls = doc.get("itls")
    if itls is not None:
        if not isinstance(itls, list) or len(itls) != n or not all(isinstance(x, list) for x in itls):
            raise DraftsimError(f"{source}: field itls must hold one list of gaps per completed request")
    model = doc.get("model_id")
    spec = doc.get("spec_decode_per_position_acceptance_rates")
    if spec is not None:
        if not isinstance(spec, list) or not spec or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in spec):
            raise DraftsimError(f"{source}: field spec_decode_per_position_acceptance_rates must be a list of rates")
        spec = tuple(float(x) / 100.0 if max(spec) > 1.0 else float(x) for x in spec)  # percent in some versions
    return VllmBench(source, model if isinstance(model, str) else None, math.inf if rate is None else rate,
                     None if conc is None else int(conc), duration, n, _array(doc, "input_lens", source, n),
                     _array(doc, "output_lens", source, n), _array(doc, "ttfts", source, n), itls,
                     _array(doc, "start_times", source, n), metrics, spec)
