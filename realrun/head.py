"""SpecDec++'s acceptance-prediction head (SpecDec++ §4.3–4.4, Appendix D).

A small network on the draft model's last hidden state predicts the probability that the
token the draft just proposed will be accepted by the target; the sim ``Threshold`` policy
(unchanged) stops drafting once 1 − Π p̂_i > h.

* **Data** (:func:`head_data`): the target's responses to the train prompts
  (:func:`draftsim.realrun.distill.target_corpus`); along them the draft's rows q_t and the target's
  p_t (teacher forcing); candidates Y_t ~ q_t with soft labels min(1, p_t(Y_t)/q_t(Y_t)), the
  probability that speculative sampling accepts Y_t. **Token mixing**: the sequence fed to
  the draft keeps the target's token with probability r and takes Y_t otherwise; the loss
  covers only the positions holding a draft token. Features: the draft's last hidden state at
  each such position (the state after consuming Y_t, as at inference).
* **Head** (:class:`AcceptanceHead`): D residual blocks x + W₂·SiLU(W₁·x), each with its own
  weights (the authors' code repeats one block object and so shares them by accident), then
  a linear layer to one logit: D + 1 layers. The draft model stays frozen.
* **Loss**: weighted binary cross-entropy with soft labels,
  −[w_acc·y·log p̂ + w_rej·(1 − y)·log(1 − p̂)], w_acc = 1.
* **Saved** as a folder (``head.pt`` + ``head.json``, schema ``draftsim.head`` v1, written
  atomically) with a fingerprint of the draft model; loading checks it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..sim.errors import DraftsimError, as_count, as_probability, folder_mode
from .models import LoadedModel

__all__ = ["AcceptanceHead", "HeadData", "head_data", "train_head", "save_head", "load_head", "fingerprint", "binary_kl"]

HEAD_SCHEMA = "draftsim.head"
HEAD_VERSION = 1


class _Block(torch.nn.Module):
    """x + W₂·SiLU(W₁·x)."""

    def __init__(self, width: int):
        super().__init__()
        self.up = torch.nn.Linear(width, width)
        self.down = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.up(x)))


class AcceptanceHead(torch.nn.Module):
    """D residual SiLU blocks (independent weights) and a linear output: a logit per state.

    ``path`` and ``meta`` say where a loaded head came from (:func:`load_head`; None and {}
    for a head trained in this process)."""

    def __init__(self, width: int, depth: int):
        super().__init__()
        self.width, self.depth = int(width), int(depth)
        self.path: str | None = None
        self.meta: dict = {}
        self.blocks = torch.nn.ModuleList([_Block(width) for _ in range(depth)])
        self.out = torch.nn.Linear(width, 1)

    def forward(self, h):
        for block in self.blocks:
            h = block(h)
        return self.out(h).squeeze(-1)

    def predict(self, h) -> np.ndarray:
        """p̂ = sigmoid(logit) per hidden state."""
        with torch.inference_mode():
            return torch.sigmoid(self(h.float())).cpu().numpy().astype(np.float64)


def fingerprint(draft: LoadedModel) -> str:
    """Identifies a draft model: its shape and a hash of a slice of its output layer."""
    w = draft.model.get_output_embeddings().weight
    with torch.no_grad():
        sample = w[:: max(1, w.shape[0] // 64), :16].float().cpu().numpy().round(5)
    cfg = draft.model.config
    key = f"{cfg.hidden_size}-{cfg.num_hidden_layers}-{cfg.vocab_size}-".encode() + sample.tobytes()
    return hashlib.sha256(key).hexdigest()[:16]


@dataclass
class HeadData:
    """Features (N, hidden) and soft acceptance labels (N,) at draft-token positions."""

    features: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def head_data(target: LoadedModel, draft: LoadedModel, corpus, mix: float, rng: np.random.Generator, progress=None) -> HeadData:
    """Training examples from ``corpus`` ((ids, prompt length) pairs: the target's responses)."""
    mix = float(as_probability("mix", mix))
    if not corpus:
        raise DraftsimError("no training data: the corpus of target responses is empty")
    feats, labels = [], []
    with torch.inference_mode():
        for ids, start in corpus:
            if len(ids) <= start:
                continue
            x = torch.tensor([ids], device=target.device)
            p = torch.softmax(target.model(x).logits[0, start - 1 : -1].double(), -1)
            q = torch.softmax(draft.model(x.to(draft.device)).logits[0, start - 1 : -1].double(), -1).to(p.device)
            T = p.shape[0]
            y = torch.multinomial(q.float(), 1, generator=torch.Generator().manual_seed(int(rng.integers(2**31)))).squeeze(1)
            label = torch.clamp(p[torch.arange(T), y] / q[torch.arange(T), y], max=1.0)
            is_draft = torch.from_numpy(rng.random(T) >= mix)
            mixed = torch.tensor(ids[start:])
            mixed[is_draft] = y[is_draft]
            z = torch.tensor([ids[:start] + mixed.tolist()], device=draft.device)
            h = draft.model(z, output_hidden_states=True).hidden_states[-1][0, start:].float()
            feats.append(h[is_draft.to(h.device)].cpu().numpy())
            labels.append(label[is_draft].cpu().numpy())
            if progress is not None:
                progress(1)
    if not labels or sum(len(a) for a in labels) == 0:
        raise DraftsimError("no draft positions to train on (mix = 1 keeps only the target's tokens)")
    return HeadData(np.concatenate(feats).astype(np.float32), np.concatenate(labels).astype(np.float64))


def binary_kl(y: np.ndarray, p_hat: np.ndarray) -> float:
    """Mean KL(Bernoulli(y) ‖ Bernoulli(p̂)) — the head's held-out error ([SD++] §5)."""
    eps = 1e-12
    y = np.clip(y, 0.0, 1.0)
    p_hat = np.clip(p_hat, eps, 1 - eps)
    kl = np.where(y > 0, y * np.log(np.maximum(y, eps) / p_hat), 0.0)
    kl += np.where(y < 1, (1 - y) * np.log(np.maximum(1 - y, eps) / (1 - p_hat)), 0.0)
    return float(kl.mean())


def train_head(data: HeadData, depth: int = 2, w_rej: float = 1.0, epochs: int = 20, lr: float = 1e-3,
               batch: int = 256, seed: int = 0, progress=None):
    """Fit a head by weighted soft-label BCE (w_acc = 1). Returns the module and its history."""
    depth = int(as_count("depth", depth, maximum=16))
    w_rej = float(w_rej)
    if not (np.isfinite(w_rej) and w_rej > 0):
        raise DraftsimError(f"w_rej must be finite and > 0; got {w_rej!r}")
    epochs = int(as_count("epochs", epochs, minimum=1, maximum=10_000))
    if len(data) == 0:
        raise DraftsimError("no training examples")
    torch.manual_seed(seed)
    head = AcceptanceHead(data.features.shape[1], depth)
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    X = torch.from_numpy(data.features)
    Y = torch.from_numpy(data.labels).float()
    gen = torch.Generator().manual_seed(seed)
    history = []
    for _ in range(epochs):
        order = torch.randperm(len(Y), generator=gen)
        total = 0.0
        for i in range(0, len(Y), batch):
            idx = order[i : i + batch]
            logit = head(X[idx])
            y = Y[idx]
            logp = torch.nn.functional.logsigmoid(logit)
            log1mp = torch.nn.functional.logsigmoid(-logit)
            loss = -(y * logp + w_rej * (1 - y) * log1mp).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        history.append(total / len(Y))
        if progress is not None:
            progress(1)
    head.eval()
    return head, history


def save_head(path, head, draft: LoadedModel, meta: dict) -> Path:
    """Write ``head.pt`` and ``head.json`` into the folder ``path``, atomically (temp + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        torch.save(head.state_dict(), tmp / "head.pt")
        info = {"schema": HEAD_SCHEMA, "version": HEAD_VERSION, "width": head.width, "depth": head.depth,
                "draft": {"name": draft.name, "fingerprint": fingerprint(draft)}, **meta}
        (tmp / "head.json").write_text(json.dumps(info, indent=1))
        os.chmod(tmp, folder_mode())  # mkdtemp creates 0700
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_head(path, draft: LoadedModel):
    """A saved head, checked to belong to ``draft``."""
    path = Path(path)
    meta_file = path / "head.json"
    if not meta_file.is_file() or not (path / "head.pt").is_file():
        raise DraftsimError(f"no acceptance head at {path} (expected head.json and head.pt; draftsim train-head writes them)")
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as exc:
        raise DraftsimError(f"{meta_file} is not valid JSON ({exc})") from None
    if meta.get("schema") != HEAD_SCHEMA or meta.get("version") != HEAD_VERSION:
        raise DraftsimError(f"{path} is not a draftsim acceptance head of version {HEAD_VERSION}")
    if meta["draft"]["fingerprint"] != fingerprint(draft):
        raise DraftsimError(f"the head at {path} was trained for draft model {meta['draft']['name']!r}, not for {draft.name!r} "
                            "(fingerprints differ); train one with draftsim train-head --drafter ...")
    head = AcceptanceHead(meta["width"], meta["depth"])
    head.load_state_dict(torch.load(path / "head.pt", weights_only=True))
    head.eval()
    head.path, head.meta = str(path), meta
    return head
