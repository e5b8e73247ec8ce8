"""Argument types and output helpers shared by the subcommands.

Argument types validate with the same checks as the Python API (:mod:`draftsim.sim.errors`), so a
bad value gives the same message — naming the value and the valid range — on both paths.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from draftsim.sim.errors import DraftsimError, as_cost, as_count, as_positive, as_probability, parse_number, parse_seconds


def _checked(check: Callable, name: str, **kwargs) -> Callable[[str], object]:
    def parse(text: str):
        try:
            value = check(name, parse_number(name, text), **kwargs)
        except DraftsimError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value.item() if isinstance(value, np.ndarray) else value

    def check_value(value):
        value = check(name, value, **kwargs)
        return value.item() if isinstance(value, np.ndarray) else value

    parse.__name__ = name
    parse.check = check_value  # the same check on a Python value (draftsim.config.check)
    return parse


def probability(name: str) -> Callable[[str], float]:
    """A float in [0, 1]."""
    return _checked(as_probability, name)


#: The largest value a cost-typed option takes (cost coefficients, noise, seconds, temperature): a
#: draft a million times slower than its target is a typo, and past it the simulators' sums of
#: squares overflow — an EWIF printed with an infinite standard error, exit 0 (--cost 1e300).
MAX_COST = 1e6


def cost(name: str, maximum: float = MAX_COST) -> Callable[[str], float]:
    """A finite float >= 0 and <= ``maximum``."""
    return _checked(as_cost, name, maximum=maximum)


def positive(name: str, maximum: float | None = None) -> Callable[[str], float]:
    """A finite float > 0 (and <= ``maximum``)."""
    return _checked(as_positive, name, **({} if maximum is None else {"maximum": maximum}))


#: Bounds of training settings handed to torch: past them a value is a typo, and in float32 it
#: overflows (lr 1e300: 'value cannot be converted to type float without overflow') or turns the
#: loss into NaN (w_rej 1e300) — a trained head or draft of NaNs reported with exit 0.
MAX_LR = 10.0
MAX_LOSS_WEIGHT = 1e6
#: The longest wall-clock budget a training command takes, in minutes (a week).
MAX_MINUTES = 7 * 24 * 60


def count(name: str, minimum: int = 0, maximum: int | None = None) -> Callable[[str], int]:
    """An integer in [minimum, maximum]."""
    return _checked(as_count, name, minimum=minimum, maximum=maximum)


# --- times ----------------------------------------------------------------------------------

# Times are read by sim.errors.parse_seconds (with the other number readers: the sim layer's specs,
# closed:clients=N,think=S, read times too); duration() is the command line's type for it.


def duration(name: str, maximum: float | None = None) -> Callable[[str], float]:
    """A time > 0 (and <= ``maximum`` seconds) read by :func:`parse_seconds`: ``30``, ``500ms``,
    ``2m``; the value is in seconds. ``.check`` checks a number of seconds given in Python."""
    extra = {} if maximum is None else {"maximum": maximum}

    def parse(text: str) -> float:
        try:
            seconds = parse_seconds(name, text)
        except DraftsimError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        try:
            return float(as_positive(name, seconds, **extra))
        except DraftsimError as exc:  # the range's message, naming the value as written (-1s, not -1)
            head = str(exc).rpartition("; got ")[0]
            raise argparse.ArgumentTypeError(f"{head}; got {text.strip()}") from None

    def check_value(value):
        return float(as_positive(name, value, **extra))

    parse.__name__ = name
    parse.check = check_value
    return parse


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def emit_json(payload: dict) -> None:
    """Write ``payload`` to stdout as one JSON document (numpy values converted)."""
    json.dump(_jsonable(payload), sys.stdout, indent=2)
    sys.stdout.write("\n")


# --- output paths -------------------------------------------------------------------------
#
# Every subcommand checks all of its output paths before it computes or writes anything, so
# that a bad path costs no time and leaves nothing behind (not even a first output written
# before a second one fails).


def _nearest_existing(path: Path) -> Path:
    for parent in [path, *path.parents]:
        if parent.exists() or parent.is_symlink():
            return parent
    return Path(".")  # pragma: no cover - the root always exists


def _probe_folder(option: str, path, folder: Path) -> None:
    """Raise unless a file can be created in ``folder`` (created and removed at once: this is
    the only honest test — permission bits do not tell about /proc, read-only mounts, ...)."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".draftsim-probe-")
    except OSError as exc:
        raise DraftsimError(f"{option} {str(path)!r}: cannot create files in {str(folder)!r} ({exc.strerror}); "
                            "give a path in a writable folder") from None
    os.close(fd)
    os.unlink(probe)


def output_file(option: str, path, suffix: str | None = None, *, new_folders: bool = False) -> Path:
    """Check that ``path`` can be written as a file (by an atomic temp + rename in its folder).

    The folder must exist, be a folder and be writable — or, with ``new_folders``, be creatable
    under a writable existing folder (made later by :func:`make_parents`, once every input is
    checked); ``path`` itself must not be a folder or anything but a regular file; with
    ``suffix``, the file name must end with it. Returns ``path`` as a :class:`Path`. Writes nothing.
    """
    if path is None or str(path).strip() == "":
        raise DraftsimError(f"{option} needs a file path; got {'' if path is None else str(path)!r}")
    p = Path(path)
    if suffix is not None and p.suffix.lower() != suffix:
        raise DraftsimError(f"{option} {str(path)!r}: the file name must end with {suffix}")
    if p.is_dir():
        raise DraftsimError(f"{option} {str(path)!r} is a folder; give a file path (e.g. {Path(path) / ('out' + (suffix or '.json'))})")
    if p.exists() and not p.is_file():
        raise DraftsimError(f"{option} {str(path)!r} exists and is not a regular file (a device, FIFO or socket); give a file path")
    folder = p.parent
    if not folder.is_dir():
        found = _nearest_existing(folder)
        if found.exists() and not found.is_dir():
            raise DraftsimError(f"{option} {str(path)!r}: {str(found)!r} is a file, not a folder")
        if not new_folders:
            raise DraftsimError(f"{option} {str(path)!r}: folder {str(folder)!r} does not exist; create it first")
        folder = found  # the folders below it are made by make_parents
    _probe_folder(option, path, folder)
    return p


def make_parents(*paths) -> None:
    """Make the missing folders above each output file (None: skipped), as --out folders are made:
    call it once every input is checked, just before the long work (:func:`output_file` with
    ``new_folders`` checked that they can be)."""
    for path in paths:
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)


def output_folder(option: str, path) -> Path:
    """Check that ``path`` is, or can be created as, a writable folder: an existing folder, or
    a new one under a writable existing folder (created later, by the writer). Writes nothing."""
    if path is None or str(path).strip() == "":
        raise DraftsimError(f"{option} needs a folder path; got {'' if path is None else str(path)!r}")
    p = Path(path)
    found = _nearest_existing(p)
    if not found.is_dir():
        what = "is a file" if found.is_file() else "is not a regular folder"
        where = f"{str(path)!r}" if found == p else f"{str(path)!r}: {str(found)!r}"
        raise DraftsimError(f"{option} {where} {what}, not a folder; give a folder path")
    _probe_folder(option, path, found)
    return p


def distinct_outputs(*pairs: tuple[str, object]) -> None:
    """Raise if two of the (option, path) outputs name the same file."""
    seen: dict = {}
    for option, path in pairs:
        if path is None:
            continue
        key = os.path.abspath(path)
        if key in seen:
            raise DraftsimError(f"{option} and {seen[key]} name the same file {str(path)!r}; give two different paths")
        seen[key] = option


# --- work budgets ---------------------------------------------------------------------------

#: Largest memory a single command may plan to use (beyond the interpreter's own ~150 MB).
MEMORY_BUDGET = 4e9
#: Longest a single command may plan to run; longer work is refused up front, with an estimate.
TIME_BUDGET = 3600.0


def _size(nbytes: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _duration(seconds: float) -> str:
    for unit, scale in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.3g} s"


def check_budget(what: str, seconds: float, nbytes: float, hint: str) -> None:
    """Refuse work whose estimated time or memory exceeds :data:`TIME_BUDGET` /
    :data:`MEMORY_BUDGET`; the message gives the estimate, the budget and ``hint`` (what to
    change)."""
    if seconds <= TIME_BUDGET and nbytes <= MEMORY_BUDGET:
        return
    raise DraftsimError(f"{what} would need about {_size(nbytes)} of memory and {_duration(seconds)}; the budget is "
                        f"{_size(MEMORY_BUDGET)} and {_duration(TIME_BUDGET)}: {hint}")


# --- real-model arguments, checked before any model loads ------------------------------------



def device(text: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether CUDA is present is checked at load):
    :func:`draftsim.realrun.models.check_device`, which needs no torch."""
    from draftsim.realrun.models import check_device

    return check_device(text)


#: A Ray cluster's address as ``ray.init`` takes it: auto, local, HOST:PORT or ray://HOST:PORT.
_RAY_ADDRESS = re.compile(r"(auto|local|(ray://)?[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:[0-9]{1,5}|(ray://)?\[[0-9A-Fa-f:.]+\]:[0-9]{1,5})")


def ray_address(option: str, text: str) -> str:
    """``text`` as a Ray cluster address (``''``: start a local cluster for the run), its form and
    port checked before any work: Ray itself refuses a malformed one with a traceback after the
    results folder is written."""
    text = text.strip()
    if text and not (_RAY_ADDRESS.fullmatch(text) and (not text[-1].isdigit() or 0 < int(text.rpartition(":")[2]) < 65536)):
        raise DraftsimError(f"{option} {text!r} is not a Ray cluster address; give auto, HOST:PORT (a port in 1..65535) or "
                            f"ray://HOST:PORT, or {option} alone to start a local cluster for the run")
    return text


def ray_reachable(option: str, text: str, timeout: float = 5.0) -> None:
    """A HOST:PORT (or ray://HOST:PORT) Ray address answers a TCP connection within ``timeout``
    seconds, checked before anything is written: ``ray.init`` at an address where nothing listens
    retries for minutes (``--ray 127.0.0.1:1`` hung over 2 minutes after the results folder was
    written). auto, local and a local cluster (``''``) are not checked."""
    import socket

    if not (text and text[-1].isdigit()):
        return
    host, _, port = text.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise DraftsimError(f"{option} {text}: nothing answers there ({reason}); start a cluster (ray start --head) or give "
                            f"{option} alone to start a local one for the run") from None


def model_name(option: str, text: str) -> str:
    """A target or neural drafter :func:`draftsim.realrun.models.load_model` can load, checked without
    loading it."""
    from draftsim.realrun.methods import check_model_name

    if not text.strip():
        raise DraftsimError(f"{option} needs a model: smollm2, tiny[:SEED], random:NAME[:SEED], a checkpoint folder or a .gguf file; got ''")
    check_model_name(text, option)
    path = Path(text).expanduser()
    if text not in ("smollm2", "tiny") and not text.startswith(("tiny:", "random:")):
        if path.is_dir():
            checkpoint(option, path)
        elif path.is_file():
            gguf_file(option, path)
    return text


#: config.json fields transformers reads as whole numbers >= 1 (its config classes refuse a string, a
#: fraction or NaN with a TypeError, and divide by the head counts), where the checkpoint gives them.
_HF_WHOLE = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "vocab_size",
             "max_position_embeddings", "head_dim", "num_experts_per_tok", "num_local_experts", "num_experts", "moe_intermediate_size",
             "n_embd", "n_layer", "n_head", "n_positions", "n_inner")
#: Expert counts a dense model's config may give as 0.
_HF_MAY_BE_ZERO = ("num_experts_per_tok", "num_local_experts", "num_experts", "moe_intermediate_size")
#: Files a checkpoint folder's tokenizer and weights are loaded from (any one of each).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.msgpack", "*.h5", "*.index.json")


def checkpoint(option: str, path: Path) -> None:
    """A Hugging Face checkpoint folder checked before it is loaded: a config.json whose numeric
    fields are whole numbers (:func:`draftsim.sim.cost.catalog.hf_whole`) with heads that divide
    the hidden size, a tokenizer and weights; each refusal one line naming the folder and what is
    missing or wrong (transformers raised a TypeError, ZeroDivisionError or its own tokenizer
    error after seconds of imports)."""
    from draftsim.sim.cost.catalog import hf_whole
    from draftsim.sim.files import parse_json, read_text

    config = path / "config.json"
    cfg = parse_json(read_text(config, "config file", 64 * 2**20, fifo=False), f"{option} {path}: config.json")
    if not isinstance(cfg, dict):
        raise DraftsimError(f"{option} {path}: config.json must be a JSON object; got a JSON {type(cfg).__name__}")
    got = {key: hf_whole(cfg, key, config, low=0 if key in _HF_MAY_BE_ZERO else 1) for key in _HF_WHOLE if cfg.get(key) is not None}
    hidden, heads = got.get("hidden_size", got.get("n_embd")), got.get("num_attention_heads", got.get("n_head"))
    if hidden and heads and "head_dim" not in got and hidden % heads:
        raise DraftsimError(f"{config}: field 'hidden_size' is {hidden}; a multiple of num_attention_heads ({heads}) is valid")
    if heads and got.get("num_key_value_heads") and heads % got["num_key_value_heads"]:
        raise DraftsimError(f"{config}: field 'num_key_value_heads' is {got['num_key_value_heads']}; a divisor of "
                            f"num_attention_heads ({heads}) is valid")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise DraftsimError(f"{option} {path}: no tokenizer in the checkpoint (one of {', '.join(_TOKENIZER_FILES)}); save it with "
                            "tokenizer.save_pretrained(FOLDER)")
    if not any(next(path.glob(pattern), None) is not None for pattern in _WEIGHT_PATTERNS):
        raise DraftsimError(f"{option} {path}: no weights in the checkpoint (*.safetensors or *.bin); save them with "
                            "model.save_pretrained(FOLDER)")


def gguf_file(option: str, path: Path) -> None:
    """A .gguf file whose header the gguf library reads, checked before transformers loads it
    (a cut or damaged file was a struct.error traceback from its reader)."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise DraftsimError(f"{option} {path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    try:
        from gguf import GGUFReader
    except ImportError:
        return  # transformers needs gguf to read it: its own message
    try:
        GGUFReader(path)
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party parser on a damaged file is the same refusal
        raise DraftsimError(f"{option} {path}: a damaged GGUF file ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") from None


def drafter_names(option: str, names: list[str], neural_only: bool = False) -> list[str]:
    """Drafter names (a lookup drafter, distilled or a loadable model), each once."""
    from draftsim.realrun.drafters import STATISTICAL_DRAFTERS

    lookups = ", ".join(STATISTICAL_DRAFTERS)
    seen = set()
    for name in names:
        if not name.strip():
            raise DraftsimError(f"{option} needs a drafter: {lookups}, distilled, tiny[:SEED], a checkpoint folder or a .gguf file; got ''")
        if name in seen:
            raise DraftsimError(f"{option} {name} is given twice; name each drafter once")
        seen.add(name)
        if name.startswith("controlled"):
            from draftsim.realrun.drafters import parse_controlled

            if neural_only:
                raise DraftsimError(f"{option} {name} is not a neural model; give distilled, tiny[:SEED], a checkpoint folder or a .gguf file")
            _, model = parse_controlled(name)
            if model is not None:
                model_name(f"{option} {name}: the cost model", model)
        elif name in STATISTICAL_DRAFTERS:
            if neural_only:
                raise DraftsimError(f"{option} {name} is not a neural model; give distilled, tiny[:SEED], a checkpoint folder or a .gguf file")
        elif name != "distilled":
            if not (name == "tiny" or name.startswith(("tiny:", "random:")) or name == "smollm2" or Path(name).expanduser().exists()):
                raise DraftsimError(f"{option} {name!r}: unknown drafter; use {lookups}, distilled (draftsim distill), "
                                    "tiny[:SEED], random:NAME[:SEED], controlled:R[@MODEL], a checkpoint folder or a .gguf file")
            model_name(option, name)
    return names


def prompt_sets(option: str, text: str) -> list[str]:
    """Comma-separated prompt set names (:data:`draftsim.realrun.prompts.ALL_SETS`), each once."""
    from draftsim.realrun.prompts import ALL_SETS as SETS

    names = [s.strip() for s in text.split(",")]
    valid = ", ".join(SETS)
    if not text.strip() or any(not s for s in names):
        raise DraftsimError(f"{option} must be comma-separated prompt sets ({valid}); got {text!r}")
    for s in names:
        if s not in SETS:
            raise DraftsimError(f"{option}: unknown prompt set {s!r}; choose from {valid}")
    if len(set(names)) != len(names):
        raise DraftsimError(f"{option} {text!r} names a prompt set twice; name each once")
    return names


def trace_folder(option: str, path, resume: bool) -> Path:
    """A folder to write a trace to: writable, and holding no trace unless ``resume``."""
    p = output_folder(option, path)
    if (p / "manifest.json").exists() and not resume:
        raise DraftsimError(f"{option} {str(path)!r} already holds a trace; pass --resume to continue it, or choose another folder")
    if p.is_dir() and not (p / "manifest.json").exists() and any(p.iterdir()):
        raise DraftsimError(f"{option} {str(path)!r} is a folder with other files in it and no trace; give a new or empty folder")
    return p
