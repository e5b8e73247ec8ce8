"""Acceptance measured elsewhere: vLLM's spec-decode counters and per-step accepted lengths.

Two formats, told apart by their content (:func:`load_acceptance_file`):

* **vLLM Prometheus counters** — a scrape of ``/metrics`` in the text exposition format, with
  ``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_draft_tokens``,
  ``vllm:spec_decode_num_accepted_tokens`` and ``vllm:spec_decode_num_accepted_tokens_per_pos``
  (label ``position``, 0-based), each possibly with the ``_total`` suffix Prometheus clients add
  to counters (vLLM ``v1/spec_decode/metrics.py``; series of several engines — told apart by
  their labels — are summed). A scrape holds each series once (the text exposition format: one
  sample per series); the same series twice (two scrapes pasted together, before and after a
  counter reset) is refused, never summed as two engines. They give
  the cumulative per-position rates a_i = accepted at position i / drafts, the convention of
  :mod:`draftsim.sim.acceptance_rates`, and a :class:`~draftsim.sim.acceptance.Positional` process.
* **Per-request accepted lengths (JSONL)** — one JSON object per request, as speculative-decoding
  benchmarks ship their traces (e.g. SpecDecode-Bench, arXiv 2601.11580): a request id
  (``id``, ``request_id`` or ``rid``), optionally the prompt and output (``prompt_len`` /
  ``output_len`` or ``prompt_token_ids`` / ``output_token_ids`` / ``generated_token_ids``), the
  draft length ``k`` (else the top-level largest observed), and per verification step either
  ``accepted`` (draft tokens accepted, 0..k) or ``acc_len`` (tokens the step emitted, bonus
  included: accepted + 1). Each request replays its own steps
  (:meth:`StepLengths.process`: a :class:`~draftsim.sim.acceptance.TraceDriven` whose rounds
  follow the recorded ones exactly when the simulated k equals the recorded k).

Both are read whole and bounded (:func:`draftsim.sim.files.read_text`: a regular file of at most
:data:`MAX_BYTES`, UTF-8, else one line naming the file); a JSONL file's nesting is bounded before
any line is parsed (:data:`MAX_DEPTH`), and the replay table the accepted lengths ask for
(tokens × k) before it is allocated (:data:`MAX_TABLE_CELLS`).

What neither format can tell: a step that accepted nothing because the drafter proposed nothing
(an n-gram without a match) and one whose proposal was rejected look alike (``acc_len == 1``).
Both are read as rejected proposals of k tokens.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .acceptance import Positional, TraceDriven
from .acceptance_rates import conditional_from_cumulative
from .errors import K_MAX_LIMIT, DraftsimError, shown
from .files import DuplicateKeyError, json_depth, read_text, unique_keys

__all__ = ["SpecDecodeCounters", "StepLengths", "read_counters", "read_step_lengths", "load_acceptance_file", "MAX_BYTES"]

#: Largest acceptance file read (bytes), checked before reading.
MAX_BYTES = 256 << 20
#: Deepest JSON nesting of an accepted-lengths line (an object of lists: 2), checked before parsing.
MAX_DEPTH = 4
#: Most cells of the replay table accepted lengths ask for (recorded tokens × k, float64: 1 GiB),
#: checked before it is allocated.
MAX_TABLE_CELLS = 1 << 27
_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
_LINE = re.compile(r"^vllm:spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens_per_pos|num_accepted_tokens)(?:_total)?"
                   r"(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _checked_path(path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise DraftsimError(f"acceptance file {str(path)!r} is not a readable file")
    size = os.path.getsize(p)
    if size > MAX_BYTES:
        raise DraftsimError(f"acceptance file {str(path)!r} is {size / 2**20:.0f} MiB; at most {MAX_BYTES >> 20} MiB is read")
    return p


def _text(path) -> str:
    """The file's text, read once and bounded; not UTF-8 (a Latin-1 export) is one line."""
    _checked_path(path)
    return read_text(path, "acceptance file", MAX_BYTES, fifo=False)


@dataclass(frozen=True)
class SpecDecodeCounters:
    """vLLM's spec-decode counters, summed over the series of a scrape."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: tuple[int, ...]  #: accepted tokens at draft position 1, 2, …
    source: str = ""

    @property
    def k(self) -> int:
        """The longest draft the counters cover (positions reported)."""
        return len(self.accepted_per_pos)

    @property
    def cumulative(self) -> np.ndarray:
        """a_i = accepted at position i / drafts (vLLM's per-position acceptance rate)."""
        return np.asarray(self.accepted_per_pos, dtype=float) / self.num_drafts

    @property
    def mean_length(self) -> float:
        """vLLM's mean acceptance length, 1 + accepted / drafts (bonus token included)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def draft_acceptance_rate(self) -> float:
        """vLLM's accepted / drafted tokens."""
        return self.num_accepted_tokens / self.num_draft_tokens

    def process(self, k: int | None = None, **kwargs) -> Positional:
        """A chain process of ``k`` positions (default: all) with these cumulative rates."""
        k = self.k if k is None else int(k)
        if not 1 <= k <= self.k:
            raise DraftsimError(f"the counters of {self.source or 'the scrape'} cover {self.k} draft position(s); k={k} needs {k}")
        return Positional.from_cumulative(self.cumulative[:k], **kwargs)


def read_counters(path) -> SpecDecodeCounters:
    """The spec-decode counters of a Prometheus text scrape (see the module docstring), checked:
    every counter present, whole and non-negative, positions 0..k−1 without a gap, the
    per-position counts summing to the accepted tokens and never increasing."""
    sums = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    per_pos: dict[int, float] = {}
    seen = set()
    series: dict[tuple, int] = {}  # (counter, labels) -> the line it was first read on
    for number, line in enumerate(_text(path).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        try:
            v = float(value)
        except ValueError:
            raise DraftsimError(f"{path}:{number}: vllm:spec_decode_{name} has value {value!r}; need a number") from None
        if not math.isfinite(v) or v < 0 or v != int(v):
            raise DraftsimError(f"{path}:{number}: vllm:spec_decode_{name} = {value}; a counter is a whole number >= 0")
        seen.add(name)
        key = (name, tuple(sorted(_LABEL.findall(labels))))
        if key in series:
            raise DraftsimError(f"{path}:{number}: the series vllm:spec_decode_{name}{{{labels}}} appears again (first on line "
                                f"{series[key]}); a scrape holds each series once — two scrapes pasted together (a counter "
                                "reset between them) are not two engines: give one scrape")
        series[key] = number
        if name == "num_accepted_tokens_per_pos":
            pos = dict(_LABEL.findall(labels)).get("position")
            if pos is None or not pos.isdigit() or int(pos) >= K_MAX_LIMIT:
                raise DraftsimError(f"{path}:{number}: num_accepted_tokens_per_pos needs a label position=\"0..{K_MAX_LIMIT - 1}\"; "
                                    f"got {{{labels}}}")
            per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + v
        else:
            sums[name] += v
    missing = [n for n in _COUNTERS if n not in seen]
    if missing:
        raise DraftsimError(f"acceptance file {str(path)!r} has no vllm:spec_decode_{missing[0]} counter "
                            f"(need {', '.join('vllm:spec_decode_' + n for n in _COUNTERS)})")
    k = max(per_pos) + 1
    if sorted(per_pos) != list(range(k)):
        gap = min(set(range(k)) - set(per_pos))
        raise DraftsimError(f"acceptance file {str(path)!r}: num_accepted_tokens_per_pos has no position {gap} (positions 0..{k - 1} needed)")
    accepted = [int(per_pos[i]) for i in range(k)]
    c = SpecDecodeCounters(int(sums["num_drafts"]), int(sums["num_draft_tokens"]), int(sums["num_accepted_tokens"]), tuple(accepted),
                           str(path))
    if c.num_drafts == 0:
        raise DraftsimError(f"acceptance file {str(path)!r}: num_drafts is 0 (no speculative step was counted)")
    if sum(accepted) != c.num_accepted_tokens:
        raise DraftsimError(f"acceptance file {str(path)!r}: the per-position accepted tokens sum to {sum(accepted)}, "
                            f"not num_accepted_tokens {c.num_accepted_tokens} (a scrape of one moment is needed)")
    if any(b > a for a, b in zip(accepted, accepted[1:])) or accepted[0] > c.num_drafts or c.num_accepted_tokens > c.num_draft_tokens:
        raise DraftsimError(f"acceptance file {str(path)!r}: counts are inconsistent (accepted per position {accepted} must not "
                            f"increase, nor exceed num_drafts {c.num_drafts}; accepted must not exceed drafted)")
    return c


@dataclass
class StepLengths:
    """Accepted draft tokens per verification step, per request, at draft length ``k``."""

    k: int
    ids: list[str]
    accepted: list[np.ndarray]  #: per request, per step: accepted draft tokens (0..k)
    prompt_len: list[int | None] = field(default_factory=list)
    output_len: list[int | None] = field(default_factory=list)
    source: str = ""

    @property
    def cumulative(self) -> np.ndarray:
        """Pooled a_i = share of steps that accepted at least i tokens, i = 1..k."""
        steps = np.concatenate(self.accepted)
        return np.array([(steps >= i).mean() for i in range(1, self.k + 1)])

    @property
    def mean_length(self) -> float:
        """Tokens per step, bonus included: 1 + mean accepted (vLLM's mean acceptance length)."""
        return 1.0 + float(np.concatenate(self.accepted).mean())

    def pooled(self, k: int | None = None, **kwargs) -> Positional:
        """A chain process with the pooled per-position rates (the steps' accepted-length
        distribution, each step drawn independently: per-request spread is lost)."""
        k = self.k if k is None else int(k)
        if not 1 <= k <= self.k:
            raise DraftsimError(f"{self.source or 'the accepted lengths'} were measured at k={self.k}; k={k} needs positions it lacks")
        return Positional.from_cumulative(self.cumulative[:k], **kwargs)

    def process(self, **kwargs) -> TraceDriven:
        """Each simulated request replays one recorded request's steps (request i: recorded
        i mod n). A step that accepted j < k tokens reads as j accepted draft positions and a
        rejection; a step that accepted all k ends with the bonus position, which no draft
        tested: it takes the pooled conditional rate of position k (an assumption). The rounds
        are recorded exactly, so a simulation at the recorded k follows them step by step."""
        c_last = float(conditional_from_cumulative(self.cumulative)[-1])
        seqs, rounds = [], []
        for steps in self.accepted:
            tokens = int((steps + 1).sum())
            data = np.zeros(tokens)
            table = np.full((tokens, self.k), np.nan)
            p = 0
            for j in steps:
                j = int(j)
                data[p:p + j] = 1.0
                table[p, :j] = 1.0
                if j < self.k:
                    table[p, j] = 0.0
                else:
                    data[p + j] = c_last
                p += j + 1
            seqs.append(data)
            rounds.append(table)
        process = TraceDriven(seqs, rounds={(1, 0): rounds}, **kwargs)
        process.source = {"accepted_lengths": self.source, "requests": len(seqs), "k": self.k}
        return process


def _whole(path, number: int, field_: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise DraftsimError(f"{path}:{number}: {field_} must be a whole number in [{low}, {high}]; got {value!r}")
    return value


def read_step_lengths(path, k: int | None = None) -> StepLengths:
    """Per-request accepted lengths from a JSONL file (see the module docstring), checked line by line."""
    ids, accepted, prompts, outputs, ks = [], [], [], [], []
    text = _text(path)
    depth = json_depth(text)
    if depth > MAX_DEPTH:
        raise DraftsimError(f"acceptance file {str(path)!r} nests arrays or objects {depth:,} levels deep; an accepted-lengths line "
                            f"nests at most {MAX_DEPTH}")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line, object_pairs_hook=unique_keys)
        except DuplicateKeyError as e:  # json keeps the last value silently
            raise DraftsimError(f"{path}:{number}: gives the key {shown(e.args[0])} twice; give each key once") from None
        except (ValueError, RecursionError) as e:  # JSONDecodeError, an integer over Python's int-string limit
            raise DraftsimError(f"{path}:{number}: not a JSON object ({str(e).split(':')[0][:80]})") from None
        if not isinstance(row, dict):
            raise DraftsimError(f"{path}:{number}: each line must be a JSON object; got {type(row).__name__}")
        rid = next((row[key] for key in ("id", "request_id", "rid") if key in row), None)
        if rid is None or isinstance(rid, (dict, list)):
            raise DraftsimError(f"{path}:{number}: no request id (id, request_id or rid)")
        given = [key for key in ("accepted", "acc_len") if key in row]
        if len(given) != 1:
            raise DraftsimError(f"{path}:{number}: give one of accepted (draft tokens accepted per step) or acc_len "
                                f"(tokens emitted per step, bonus included); got {given or 'neither'}")
        steps = row[given[0]]
        if not isinstance(steps, list) or not steps or len(steps) > 10**6:
            raise DraftsimError(f"{path}:{number}: {given[0]} must be a non-empty list of whole numbers (at most 1e6 steps)")
        low = 1 if given[0] == "acc_len" else 0
        values = [_whole(path, number, f"{given[0]}[{i}]", v, low, K_MAX_LIMIT + low) for i, v in enumerate(steps)]
        arr = np.asarray(values, dtype=np.int64) - low
        if "k" in row:
            ks.append(_whole(path, number, "k", row["k"], 1, K_MAX_LIMIT))
            if arr.max() > ks[-1]:
                raise DraftsimError(f"{path}:{number}: a step accepted {arr.max()} tokens but k is {ks[-1]}")
        lengths = {}
        for name, ids_key in (("prompt_len", "prompt_token_ids"), ("output_len", "output_token_ids")):
            if name in row:
                lengths[name] = _whole(path, number, name, row[name], 0, 10**9)
            elif ids_key in row or (name == "output_len" and "generated_token_ids" in row):
                seq = row.get(ids_key, row.get("generated_token_ids"))
                if not isinstance(seq, list):
                    raise DraftsimError(f"{path}:{number}: {ids_key} must be a list of token ids")
                lengths[name] = len(seq)
        ids.append(str(rid))
        accepted.append(arr)
        prompts.append(lengths.get("prompt_len"))
        outputs.append(lengths.get("output_len"))
    if not accepted:
        raise DraftsimError(f"acceptance file {str(path)!r} holds no request")
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DraftsimError(f"acceptance file {str(path)!r}: request id {dup!r} appears twice")
    if len(set(ks)) > 1:
        raise DraftsimError(f"acceptance file {str(path)!r}: requests were drafted at different k ({sorted(set(ks))}); give one k")
    observed = int(max(a.max() for a in accepted))
    kk = ks[0] if ks else (k if k is not None else observed)
    if kk < observed or kk < 1:
        raise DraftsimError(f"acceptance file {str(path)!r}: a step accepted {observed} tokens, more than k={kk}")
    tokens = sum(int(a.sum()) + len(a) for a in accepted)
    if tokens * int(kk) > MAX_TABLE_CELLS:
        raise DraftsimError(f"acceptance file {str(path)!r}: its steps emit {tokens:,} tokens at k={kk}, a replay table of "
                            f"{tokens * int(kk):,} cells (tokens × k); draftsim replays at most {MAX_TABLE_CELLS:,}")
    return StepLengths(int(kk), ids, accepted, prompts, outputs, str(path))


def load_acceptance_file(path) -> SpecDecodeCounters | StepLengths:
    """Counters or accepted lengths, by the file's content: a line starting ``{`` is JSONL,
    ``vllm:``/``#`` a Prometheus scrape; anything else is refused naming both formats."""
    p = _checked_path(path)
    with open(p, "rb") as fh:
        head = fh.read(4096).decode("utf-8-sig", errors="replace").lstrip()
    if head.startswith(("{", "[")):
        return read_step_lengths(p)
    if head.startswith(("#", "vllm:")):
        return read_counters(p)
    raise DraftsimError(f"acceptance file {str(path)!r} is neither per-request accepted lengths (JSONL, one object per line) "
                        "nor a vLLM Prometheus scrape (lines 'vllm:spec_decode_...')")
