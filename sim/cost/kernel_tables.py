"""NVIDIA AIConfigurator's measured kernel tables, found and read as they are installed.

The tables ship in the PyPI package ``aiconfigurator-core`` (Apache-2.0), pinned at
:data:`PINNED_VERSION` and installed with the ``operators`` extra (``pip install
'draftsim[operators]'``), as ``systems/data/<gpu>/<op>/<engine>/<engine version>/*.parquet``. They
are read with pyarrow; the package itself is never imported (its query API is private). This
module finds them and selects the rows draftsim prices from: bfloat16 GEMMs of one kernel, full
attention over a bfloat16 KV cache of one kernel, the custom all-reduce. The operator model
(:mod:`~draftsim.sim.cost.operators`) prices from these rows; the efficiency curves
(:mod:`~draftsim.sim.cost.efficiency`) are fitted on them.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re
from pathlib import Path

from ..errors import DraftsimError

__all__ = ["FRAMEWORKS", "PACKAGE", "PINNED_VERSION", "SYSTEMS", "allreduce_rows", "attention_rows", "gemm_rows", "mem_op_constants",
           "newest_table", "read_columns", "systems_root"]

#: The PyPI distribution that ships the tables, and the version draftsim reads.
PACKAGE = "aiconfigurator-core"
PINNED_VERSION = "0.12.0"
#: Catalog hardware → AIConfigurator's system folder (systems/<name>.yaml, systems/data/<name>/).
SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-80g": "a100_sxm", "b200": "b200_sxm", "gb200": "gb200"}
#: draftsim engine → AIConfigurator framework folder (``none``: vLLM's kernels, no engine overheads).
FRAMEWORKS = {"vllm": "vllm", "vllm-v0.6": "vllm", "sglang": "sglang", "none": "vllm"}

INSTALL = f"pip install 'draftsim[operators]' ({PACKAGE}=={PINNED_VERSION})"


def systems_root() -> Path:
    """The installed package's ``systems`` folder, found without importing the package; one-line
    :class:`DraftsimError` when it is missing or another version is installed."""
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise DraftsimError(f"--cost-model operators reads NVIDIA AIConfigurator's measured operator tables, which are not installed: "
                            f"{INSTALL}") from None
    if version != PINNED_VERSION:
        raise DraftsimError(f"--cost-model operators reads {PACKAGE} {PINNED_VERSION}'s tables; {version} is installed: {INSTALL}")
    spec = importlib.util.find_spec("aiconfigurator_core")  # a top-level name: found, not imported
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        root = Path(loc) / "systems"
        if (root / "data").is_dir():
            return root
    raise DraftsimError(f"{PACKAGE} {version} is installed but holds no systems/data folder: reinstall it ({INSTALL})")


def _version_key(v: str) -> tuple:
    return tuple((0, int(x)) if x.isdigit() else (1, x) for x in re.findall(r"\d+|[a-z]+", v.lower()))


def newest_table(root: Path, system: str, op: str, framework: str, filename: str) -> Path | None:
    """``root/data/system/op/framework/<version>/filename`` of the newest engine version that holds it."""
    folder = Path(root) / "data" / system / op / framework
    if not folder.is_dir():
        return None
    versions = sorted((p for p in folder.iterdir() if (p / filename).is_file()), key=lambda p: _version_key(p.name))
    return versions[-1] / filename if versions else None


@functools.lru_cache(maxsize=64)
def read_columns(path: str, columns: tuple[str, ...]):
    """The named columns of a parquet table that holds them (older tables lack some, e.g. window_size)."""
    import pyarrow.parquet as pq

    present = set(pq.read_schema(path).names)
    return pq.read_table(path, columns=[c for c in columns if c in present]).to_pandas()


def mem_op_constants(root: Path, system: str) -> tuple[float, float, float]:
    """(memory bandwidth B/s, empirical scaling, constant seconds) of AIConfigurator's analytic memory-op
    formula, from systems/<system>.yaml (read as text: three numbers)."""
    text = (Path(root) / f"{system}.yaml").read_text()

    def num(key: str) -> float:
        m = re.search(rf"^\s*{key}:\s*([0-9.eE+-]+)", text, re.MULTILINE)
        if m is None:
            raise DraftsimError(f"{Path(root) / (system + '.yaml')} holds no {key}")
        return float(m.group(1))

    return num("mem_bw"), num("mem_bw_empirical_scaling_factor"), num("mem_empirical_constant_latency")


def gemm_rows(path: Path):
    """(kernel, rows m, n, k, latency in ms) of the table's bfloat16 GEMMs of one kernel: PyTorch's
    ``torch.nn.functional.linear`` where measured (what vLLM runs for unquantised layers), else the first."""
    df = read_columns(str(path), ("kernel_source", "gemm_dtype", "m", "n", "k", "latency"))
    df = df[df.gemm_dtype == "bfloat16"]
    if df.empty:
        raise DraftsimError(f"{path} holds no bfloat16 GEMMs")
    kernels = sorted(df.kernel_source.unique())
    kernel = next((k for k in kernels if "torch" in k and "linear" in k), kernels[0])
    return kernel, df[df.kernel_source == kernel]


def attention_rows(path: Path, kv: str = "bfloat16"):
    """(kernel, rows) of an attention table: full attention (no window) over a KV cache of the table's
    ``kv_cache_dtype`` ``kv`` ("bfloat16" or "fp8"), of FlashAttention-3 where measured (Hopper's default:
    AIConfigurator's attention_lane_defaults.yaml), else of the kernel the table measures most (ties: by
    name), its engine's default lane on the other GPUs' tables (aiconfigurator-core 0.12.0): vLLM 0.24.0's
    FlashInfer TRT-LLM kernels on Blackwell (``vllm_flashinfer_trtllmdecode`` in the decode table,
    ``vllm_flashinfer_trtllmprefill`` in the prefill one, whose few ``trtllmdecode`` rows are one-token
    "prompts"), FlashAttention-2 on Ada (L40S) and Ampere; SGLang 0.5.14's ``trtllm_mha`` on Blackwell
    (sgl-project/sglang python/sglang/srt/server_args.py ``_get_default_attn_backend``: ``trtllm_mha`` for an
    MHA model on SM100) and ``flashinfer`` on Ada (its default off Hopper and Blackwell). Columns batch_size,
    isl, step, num_heads, num_key_value_heads, head_dim, latency (ms)."""
    df = read_columns(str(path), ("kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype",
                                  "window_size", "step", "latency"))
    df = df[df.kv_cache_dtype == kv]
    if "window_size" in df:  # full attention only (tables without the column measured no window)
        df = df[df.window_size == 0]
    if df.empty:
        return "", df
    counts = df.kernel_source.value_counts()
    kernel = next((k for k in sorted(counts.index) if "fa3" in k), None) or min(counts.index, key=lambda k: (-counts[k], k))
    return kernel, df[df.kernel_source == kernel]


def allreduce_rows(path: Path):
    """The custom all-reduce's rows: num_gpus, message_size (elements), latency (ms), kernel_source
    (``..._graph``: the kernel replayed in a CUDA graph; else launched eagerly)."""
    return read_columns(str(path), ("num_gpus", "message_size", "latency", "kernel_source"))
