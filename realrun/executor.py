"""Speculative decoding on real models, driven by the same policy objects as the simulators.

The executor keeps a KV cache per model (transformers' ``DynamicCache``) with one
invariant: a model's cache holds the committed text except its last token (the *pending*
token, fed at the start of the next call). A round:

1. ``policy.begin_round(state)`` gives the plan (a block of drafter-1 steps); the drafter
   drafts token by token, and after each one ``policy.stop(state, i, obs)`` may end the
   draft (``obs``: the drafter's probability of its token as confidence and prediction);
2. the target scores the pending token and the draft in one forward call (k + 1 rows);
3. :func:`sim.verify.verify_block` (sampling, any rule) or ``verify_block_greedy`` decides;
4. both caches are cropped back to the accepted prefix (rollback), and
   ``policy.end_round(state, drafted, accepted)`` gets the feedback.

Every round is logged (drafted, accepted, per-call seconds), which is what the trace of a
run holds. Batch size 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from sim.distributions import warp
from sim.errors import DraftsimError
from sim.policies import Autoregressive, Policy
from sim.rules import SD, Rule
from sim.verify import verify_block, verify_greedy_ids

from .drafters import Drafter, MaxGram, NeuralDraft
from .models import LoadedModel

__all__ = ["Sampling", "RunLog", "CachedLM", "generate"]


@dataclass(frozen=True)
class Sampling:
    """Decoding mode: greedy (temperature 0) or sampling with temperature and top-k,
    applied identically to the draft's and the target's distributions."""

    temperature: float = 0.0
    top_k: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def rows(self, logits) -> np.ndarray:
        import torch

        probs = torch.softmax(logits.double(), dim=-1).cpu().numpy()
        return warp(probs, self.temperature, self.top_k) if not self.greedy or self.top_k else probs


@dataclass
class RunLog:
    """What a run did: tokens, and per round what was drafted, accepted and how long calls took."""

    output: list = field(default_factory=list)
    rounds: list = field(default_factory=list)  # dicts: drafted, accepted, draft_seconds, target_seconds
    draft_calls: int = 0
    target_calls: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return len(self.output)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target call, bonus included."""
        return self.tokens / max(self.target_calls, 1)


class CachedLM:
    """A causal LM with a KV cache that can be cropped (rollback)."""

    def __init__(self, loaded: LoadedModel):
        from transformers import DynamicCache

        self.loaded = loaded
        self.cache = DynamicCache()
        self.length = 0  # tokens in the cache

    def feed(self, ids: list[int]):
        """Append ``ids`` to the cache; return their next-token logits, one row per token."""
        import torch

        if not ids:
            raise DraftsimError("nothing to feed")
        with torch.inference_mode():
            out = self.loaded.model(torch.tensor([ids], device=self.loaded.device), past_key_values=self.cache, use_cache=True)
        self.length += len(ids)
        return out.logits[0].float()

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens."""
        if length < self.length:
            self.cache.crop(length - self.length)  # a negative count: drop that many tokens from the end
            self.length = length


def _check_context(target: LoadedModel, prompt: list[int], max_new_tokens: int) -> None:
    limit = getattr(target.model.config, "max_position_embeddings", None)
    if limit is not None and len(prompt) + max_new_tokens > limit:
        raise DraftsimError(
            f"prompt of {len(prompt)} tokens + {max_new_tokens} new tokens exceeds the target's context of {limit}"
        )
    if not prompt:
        raise DraftsimError("the prompt is empty")


def generate(
    target: LoadedModel,
    prompt: list[int],
    max_new_tokens: int,
    policy: Policy | None = None,
    drafter: Drafter | None = None,
    sampling: Sampling = Sampling(),
    rule: Rule | None = None,
    rng: np.random.Generator | None = None,
    stop_at_eos: bool = True,
) -> RunLog:
    """Generate up to ``max_new_tokens`` after ``prompt``: autoregressively, or by speculative
    decoding with ``drafter`` under ``policy`` (a :mod:`sim.policies` object).

    Greedy decoding reproduces the target's own greedy output exactly; sampling with the
    :class:`sim.rules.SD` rule keeps the target's distribution (other rules: the rule's π).
    """
    policy = policy or Autoregressive()
    rule = rule or SD()
    if not sampling.greedy and rng is None:
        raise DraftsimError("sampling needs rng=np.random.default_rng(seed)")
    if policy.kind != "chain" or policy.n_models > 2:
        raise DraftsimError(f"{policy!r} is not a single-drafter chain policy; use the cascade executor")
    if policy.n_models == 2 and drafter is None:
        raise DraftsimError(f"{policy!r} needs a drafter")
    if isinstance(drafter, NeuralDraft) and drafter.vocab != target.vocab_size:
        raise DraftsimError(f"drafter {drafter.name} and the target have different vocabularies ({drafter.vocab} vs {target.vocab_size})")
    _check_context(target, prompt, max_new_tokens)
    eos = target.tokenizer.eos_token_id if stop_at_eos else None
    log = RunLog()
    t_run = time.perf_counter()
    tgt = CachedLM(target)
    t0 = time.perf_counter()
    if len(prompt) > 1:
        tgt.feed(prompt[:-1])
    log.prefill_seconds = time.perf_counter() - t0
    draft_lm = CachedLM(drafter.loaded) if isinstance(drafter, NeuralDraft) else None
    committed = list(prompt)  # the pending token is committed[-1]
    state = policy.init(1)
    while log.tokens < max_new_tokens and (eos is None or not log.output or log.output[-1] != eos):
        plan = policy.begin_round(state)
        budget = min(int(np.asarray(plan[0].steps).reshape(-1)[0]) if plan else 0, max_new_tokens - log.tokens - 1)
        t0 = time.perf_counter()
        drafted, q_rows = _draft(drafter, draft_lm, committed, len(prompt), budget, policy, state, sampling, rng, log) if budget > 0 else ([], [])
        t_draft = time.perf_counter() - t0
        t0 = time.perf_counter()
        logits = tgt.feed([committed[-1]] + drafted)
        log.target_calls += 1
        t_target = time.perf_counter() - t0
        if sampling.greedy:
            # Only the argmax matters: compare ids, no distributions needed.
            res = verify_greedy_ids(np.array(drafted, dtype=np.int64), logits.argmax(dim=-1).cpu().numpy())
        else:
            p_rows = sampling.rows(logits)
            q = np.stack(q_rows) if drafted else np.zeros((0, p_rows.shape[1]))
            res = verify_block(np.array(drafted, dtype=np.int64), q, p_rows, rule, rng, validate=False)
        n = int(res.n_accepted)
        new = drafted[:n] + [int(res.token)]
        # Rollback: the target keeps the pending token and the accepted draft.
        tgt.rollback(tgt.length - (len(drafted) - n))
        if draft_lm is not None:
            draft_lm.rollback(min(draft_lm.length, len(committed) + n))
        committed.extend(new)
        log.output.extend(new)
        log.rounds.append({"drafted": len(drafted), "accepted": n, "draft_seconds": t_draft, "target_seconds": t_target})
        policy.end_round(state, np.array([len(drafted)]), np.array([n]))
        if drafter is not None:
            drafter.feedback(n)
    if eos is not None and eos in log.output:
        log.output = log.output[: log.output.index(eos) + 1]
    log.output = log.output[:max_new_tokens]
    log.seconds = time.perf_counter() - t_run
    return log


def _draft(drafter, draft_lm, committed, prompt_len, budget, policy, state, sampling, rng, log):
    """Draft up to ``budget`` tokens; the policy may stop after any of them."""
    has_stop = type(policy).stop is not Policy.stop
    if isinstance(drafter, NeuralDraft):
        import torch

        tokens, rows = [], []
        feed = committed[draft_lm.length :]  # catch up: the pending token (and any unfed accepted ones)
        for i in range(budget):
            logits = draft_lm.feed(feed)[-1]
            log.draft_calls += 1
            if sampling.greedy:  # the argmax and its probability are all a greedy round needs
                tok = int(logits.argmax())
                conf = float(torch.softmax(logits.double(), -1)[tok]) if has_stop else 1.0
            else:
                q = sampling.rows(logits[None, :])[0]
                tok = int(rng.choice(len(q), p=q / q.sum()))
                conf = float(q[tok])
                rows.append(q)
            tokens.append(tok)
            feed = [tok]
            if not has_stop:
                continue
            stop = policy.stop(state, i, {"prob": conf, "pred": np.array([conf]), "conf": np.array([conf])})
            if stop is not None and bool(np.asarray(stop).reshape(-1)[0]):
                break
        return tokens, rows
    # Non-neural drafters propose the whole block at once (cost ~ 0); the policy still sees each token.
    if isinstance(drafter, MaxGram):
        tokens, q = drafter.propose(committed, budget, prompt_len=prompt_len)
    else:
        tokens, q = drafter.propose(committed, budget)
    log.draft_calls += 1
    kept = []
    for i, tok in enumerate(tokens):
        kept.append(tok)
        conf = q.prob([tok])
        stop = policy.stop(state, i, {"prob": conf[0], "pred": conf, "conf": conf})
        if stop is not None and bool(np.asarray(stop).reshape(-1)[0]):
            break
    return kept, [q.row(i) for i in range(len(kept))]
