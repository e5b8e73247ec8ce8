"""Derive the committed subset of Vidur's public operator profiles (microsoft/vidur, MIT licence)
from a clone of that repository; ``benchmarks/bench_vidur.py`` scores draftsim's operator model on it.

Run: ``python benchmarks/data/vidur/derive.py --git-dir /path/to/vidur/.git`` (a clone or a bare
mirror holding the commits below). It reads each file with ``git show <commit>:<path>``, keeps the
rows and columns listed in README.md, and writes ``models.csv``, ``gemm.csv``, ``attention_a100.csv``
and ``all_reduce.csv`` beside itself; the same clone gives the same bytes.
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
#: the snapshot the compute and network profiles are read at (microsoft/vidur main, 2024-11)
HEAD = "7d47513363ec447a741ac5e47241580b47724fbf"
#: the one attention profile whose bytes the public snapshot holds: the pre-release copy of the internal fork's
#: data/profiling/a100/attention.csv (blob ee3dec7), deleted at 44bc599 when the per-model files replaced it
ATTENTION_COMMIT = "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a"
ATTENTION_PATH = "data/profiling/a100/attention.csv"

#: Vidur's model folders (data/profiling/compute/<gpu>/<org>/<model>/mlp.csv) and the biases its model
#: configs give the linear layers (vidur/config/model_config.py: phi-2 all, Qwen the QKV projection)
MODELS = {
    "meta-llama/Llama-2-7b-hf": "none",
    "meta-llama/Llama-2-70b-hf": "none",
    "meta-llama/Meta-Llama-3-8B": "none",
    "meta-llama/Meta-Llama-3-70B": "none",
    "codellama/CodeLlama-34b-Instruct-hf": "none",
    "internlm/internlm-20b": "none",
    "Qwen/Qwen-72B": "qkv",
    "microsoft/phi-2": "all",
}
GPUS = ("a100", "h100")
NETWORKS = ("a100_dgx", "h100_dgx")
#: Vidur's operator names of the four GEMMs of a layer (vidur/profiling/mlp/mlp_impl.py)
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def _show(git_dir: str, commit: str, path: str) -> pd.DataFrame:
    out = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True, capture_output=True).stdout
    return pd.read_csv(io.BytesIO(out))


def _last_commit(git_dir: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "log", "-1", "--format=%H", HEAD, "--", path], check=True,
                          capture_output=True, text=True).stdout.strip()


def token_grid(top: int) -> list[int]:
    """1, 2, 4 and, from 8, each power of two with its 1.25x and 1.5x (all on Vidur's token grid)."""
    out = {1, 2, 4}
    p = 8
    while p <= top:
        out |= {p, p * 5 // 4, p * 3 // 2}
        p *= 2
    return sorted(x for x in out if x <= top)


def near_log_grid(values: np.ndarray, targets) -> list:
    """The measured value nearest in log to each target (each once)."""
    v = np.sort(np.unique(values))
    picks = {v[int(np.argmin(np.abs(np.log(v) - np.log(t))))] for t in targets}
    return sorted(picks)


def derive(git_dir: str) -> None:
    models, gemm = [], []
    for gpu in GPUS:
        for model, bias in MODELS.items():
            path = f"data/profiling/compute/{gpu}/{model}/mlp.csv"
            try:
                df = _show(git_dir, HEAD, path)
            except subprocess.CalledProcessError:
                continue  # Vidur has no profile of this model on this GPU
            shape = df[["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]].drop_duplicates()
            assert len(shape) == 1, path
            models.append({"gpu": gpu, "model": model, **shape.iloc[0].to_dict(), "linear_bias": bias, "source": path,
                           "commit": _last_commit(git_dir, path)})
            keep = df[df.num_tokens.isin(token_grid(int(df.num_tokens.max())))]
            for _, r in keep.sort_values(["num_tensor_parallel_workers", "num_tokens"]).iterrows():
                gemm.append({"gpu": gpu, "model": model, "tp": int(r.num_tensor_parallel_workers), "num_tokens": int(r.num_tokens),
                             **{op: round(float(r[f"time_stats.{op}.median"]), 5) for op in GEMMS}})
    pd.DataFrame(models).to_csv(HERE / "models.csv", index=False)
    pd.DataFrame(gemm).to_csv(HERE / "gemm.csv", index=False)

    att = _show(git_dir, ATTENTION_COMMIT, ATTENTION_PATH)
    layout = att[["n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "block_size", "attention_backend",
                  "profile_method"]].drop_duplicates()
    assert len(layout) == 1, layout
    rows = []
    dec = att[~att.is_prefill]
    batches = [b for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128) if b in set(dec.batch_size)]
    kvs = near_log_grid(dec.kv_cache_size.to_numpy(), [32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096])
    dec = dec[dec.batch_size.isin(batches) & dec.kv_cache_size.isin(kvs)]
    pre = att[att.is_prefill]
    whole = pre[pre.kv_cache_size == 0]
    whole = whole[whole.prefill_chunk_size.isin(near_log_grid(whole.prefill_chunk_size.to_numpy(),
                                                              [32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]))]
    chunk = pre[(pre.kv_cache_size > 0) & pre.prefill_chunk_size.isin([64, 128, 256, 512, 1024, 2048])]
    chunk = chunk[(chunk.kv_cache_size % chunk.prefill_chunk_size == 0)
                  & (chunk.kv_cache_size // chunk.prefill_chunk_size).isin([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48])]
    key = ["batch_size", "prefill_chunk_size", "kv_cache_size"]
    for frame, kind in ((dec, "decode"), (pd.concat([whole, chunk]), "prefill")):
        # a whole prompt is also the first chunk of the chunked grid: such a shape measured twice keeps its first row
        for _, r in frame.drop_duplicates(key).sort_values(key).iterrows():
            rows.append({"phase": kind, "batch_size": int(r.batch_size), "prefill_chunk_size": int(r.prefill_chunk_size),
                         "kv_cache_size": int(r.kv_cache_size), "attn": round(float(r[f"time_stats.attn_{kind}.median"]), 5),
                         "attn_input_reshape": round(float(r["time_stats.attn_input_reshape.median"]), 5),
                         "attn_output_reshape": round(float(r["time_stats.attn_output_reshape.median"]), 5)})
    pd.DataFrame(rows).to_csv(HERE / "attention_a100.csv", index=False)

    ar = []
    for net in NETWORKS:
        df = _show(git_dir, HEAD, f"data/profiling/network/{net}/all_reduce.csv")
        df = df[df.devices_per_node == df.num_workers]  # one node: every worker on NVLink/NVSwitch
        for w, d in df.groupby("num_workers"):
            elements = d["size"].to_numpy() // 2
            picks = near_log_grid(elements, [2.0 ** (k / 2) for k in range(20, 51)])
            # a size on the edge of two of Vidur's size ranges was measured twice: its first row is kept
            for _, r in d[(d["size"] // 2).isin(picks)].drop_duplicates("size").sort_values("size").iterrows():
                ar.append({"network": net, "num_workers": int(w), "size_bytes": int(r["size"]),
                           **{s: round(float(r[f"time_stats.all_reduce.{s}"]), 5) for s in ("median", "min", "max")}})
    pd.DataFrame(ar).to_csv(HERE / "all_reduce.csv", index=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", required=True, help="the .git folder (or bare mirror) of a microsoft/vidur clone")
    derive(parser.parse_args().git_dir)


if __name__ == "__main__":
    main()
