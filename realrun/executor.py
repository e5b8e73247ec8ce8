"""Speculative decoding on real models, driven by the same policy objects as the simulators.

One executor runs every chain policy of :mod:`draftsim.sim.policies`: autoregressive decoding,
speculative decoding with one drafter (``FixedK``, ``Heuristic``, ``ConfidenceStop``,
``Threshold``), and Cascade Speculative Drafting — horizontal cascades and vertical cascades
with any K matrix, Max-Gram (or any statistical drafter) at the bottom. The policy's plan
(:class:`draftsim.sim.policies.Block`, nested for vertical cascades) is executed as it stands:

* a block without ``inner`` drafts ``steps`` tokens with its model;
* a block with ``inner`` runs ``steps`` speculative rounds of its model over the draft its
  own plan builds; the model verifies that draft with the inner rule (leniency: [CSD] §3.1,
  only ever applied by drafters) and emits the accepted tokens plus its correction or bonus;
* the target verifies the top-level draft in one forward call with the run's rule:
  :class:`draftsim.sim.rules.SD` (lossless) or a speculative-cascade deferral rule ([SC] Algorithm 4 /
  block verification with Chow, Diff, OPT, TokenV1–3, Lossy, BiLD, top-level leniency).

Verification is the verification core (:mod:`draftsim.sim.verify`): ``verify_block`` when sampling,
``verify_block_greedy`` at temperature 0. For lossless sampling through a vertical cascade
every proposed token carries the distribution it was actually proposed from — the inner
rule's output for tokens produced by an inner verification, the drafter's own row for its
bonus token — exactly as :class:`draftsim.sim.exact.VerticalProcess` proves lossless.

KV caches: each neural model keeps a :class:`~draftsim.realrun.kvcache.CachedLM` (the batched
server's ragged cache with one row); before a call it is rolled back to its longest prefix
shared with the context (after rejections, at any level) and only the rest is fed.

Every executor — :func:`generate` here, :func:`token_cascade` (the sequential token-level
cascade baseline, [SC] Algorithm 2) and :func:`draftsim.realrun.trees.generate_tree` — runs the same
round loop (:func:`decode`) and logs the same records (:class:`RunLog`, :mod:`draftsim.sim.records`),
which :mod:`draftsim.realrun.runs` writes as run traces and :mod:`draftsim.sim.replay` gives back to ``sim``.
Batch size 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..sim.distributions import warp
from ..sim.errors import DraftsimError
from ..sim.policies import Autoregressive, Block, FixedK, Policy
from ..sim.records import Call, DraftEvent, Round
from ..sim.rules import SD, Leniency, Rule
from ..sim.verify import verify_block, verify_block_greedy, verify_greedy_ids
from .drafters import Drafter, NeuralDraft
from .kvcache import CachedLM
from .models import LoadedModel, same_tokenizer, sync

__all__ = ["Sampling", "RunLog", "RoundResult", "decode", "generate", "prefill", "token_cascade",
           "check_context", "check_drafters", "check_sampling", "eos_id"]

_now = time.perf_counter
_ONE_TOKEN = FixedK(1)  # the sequential cascade's shape for _Run: one drafter token per step


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
        """Distributions from logits (rows): warped when sampling; untempered (top-k only) when greedy."""
        import torch

        probs = torch.softmax(logits.double(), dim=-1).cpu().numpy()
        return warp(probs, self.temperature, self.top_k) if not self.greedy or self.top_k else probs


@dataclass
class RunLog:
    """What a run did: the ``output`` tokens and the run's records (:mod:`draftsim.sim.records`) —
    ``rounds`` (:class:`~draftsim.sim.records.Round`, one per target verification), ``calls``
    (:class:`~draftsim.sim.records.Call`, one per forward call or statistical proposal) and ``drafts``
    (:class:`~draftsim.sim.records.DraftEvent`, one per proposed token at every level). ``seconds`` is
    the run's wall time, prefill included; ``prefill_seconds`` the target's prefill call (0
    when the prefill rode on the first verification: ``generate(prefill_apart=False)``)."""

    output: list[int] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    drafts: list[DraftEvent] = field(default_factory=list)
    seconds: float = 0.0
    prefill_seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return len(self.output)

    @property
    def target_calls(self) -> int:
        return sum(1 for c in self.calls if c.model == 0 and c.kind != "prefill")

    @property
    def draft_calls(self) -> int:
        return sum(1 for c in self.calls if c.model != 0)

    @property
    def drafted(self) -> int:
        """Tokens proposed to the target (see :class:`draftsim.sim.records.Round`)."""
        return sum(r.drafted for r in self.rounds)

    @property
    def accepted(self) -> int:
        """Proposed tokens the target accepted."""
        return sum(r.accepted for r in self.rounds)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target call, bonus included."""
        return self.tokens / max(self.target_calls, 1)

    @property
    def call_seconds(self) -> float:
        """Time spent in calls: forward calls and statistical drafters' proposals."""
        return sum(c.seconds for c in self.calls)

    @property
    def overhead_seconds(self) -> float:
        """The executor's own time: the run's wall time outside its calls (setup and every
        round's :attr:`draftsim.sim.records.Round.overhead_seconds`)."""
        return self.seconds - self.call_seconds

    def calls_per_model(self, n_models: int) -> list[int]:
        out = [0] * n_models
        for c in self.calls:
            if c.kind != "prefill":
                out[c.model] += 1
        return out

    def levels(self) -> dict[tuple[int, int], dict]:
        """Drafted and accepted tokens per (proposer, verifier)."""
        out: dict = {}
        for d in self.drafts:
            e = out.setdefault((d.proposer, d.verifier), {"drafted": 0, "accepted": 0})
            e["drafted"] += 1
            e["accepted"] += int(d.accepted)
        return out


# ---------------------------------------------------------------- checks shared by the executors

def check_sampling(sampling: Sampling, rng) -> None:
    """Raise unless a sampling run has its generator."""
    if not sampling.greedy and rng is None:
        raise DraftsimError("sampling needs rng=np.random.default_rng(seed)")


def check_context(target: LoadedModel, prompt: list[int], max_new_tokens: int) -> None:
    """Raise unless ``prompt`` is non-empty and ``max_new_tokens`` more fit the target's context."""
    if not prompt:
        raise DraftsimError("the prompt is empty")
    limit = getattr(target.model.config, "max_position_embeddings", None)  # a transformers config, not ours
    if limit is not None and len(prompt) + max_new_tokens > limit:
        raise DraftsimError(
            f"prompt of {len(prompt)} tokens + {max_new_tokens} new tokens exceeds the target's context of {limit}"
        )


def check_drafters(target: LoadedModel, drafters: list[Drafter]) -> None:
    """Raise unless every drafter shares the target's vocabulary and token ids."""
    for d in drafters:
        if d.vocab is not None and d.vocab != target.vocab_size:
            raise DraftsimError(f"drafter {d.name} and the target have different vocabularies ({d.vocab} vs {target.vocab_size})")
        tok = d.tokenizer
        if tok is not None and tok is not target.tokenizer and not same_tokenizer(tok, target.tokenizer):
            raise DraftsimError(f"drafter {d.name} does not share the target's tokenizer (token ids differ); "
                                "speculative decoding needs one vocabulary")


def _check_chain_policy(policy: Policy, drafters: list[Drafter]) -> None:
    if policy.kind != "chain":
        raise DraftsimError(f"{policy!r} is a {policy.kind} policy; this executor runs chain policies (tree drafting has its own)")
    need = policy.n_models - 1
    if len(drafters) < need:
        have = ", ".join(d.name for d in drafters) or "none"
        raise DraftsimError(f"{policy!r} needs {need} drafter(s) (models 1..{need}); got {len(drafters)} ({have})")
    if len(drafters) > need:
        raise DraftsimError(f"{policy!r} uses {need} drafter(s) but {len(drafters)} were given; "
                            f"a K matrix must have one row and column per model (target + drafters)")


def eos_id(target: LoadedModel, stop_at_eos: bool) -> int | None:
    """The token that ends a run (None: run to the budget)."""
    return target.tokenizer.eos_token_id if stop_at_eos else None


# ---------------------------------------------------------------- the round loop

@dataclass(slots=True)
class RoundResult:
    """What one round hands to :func:`decode`: its new tokens (the accepted draft tokens, then
    the verifier's own — correction or bonus), the drafted and accepted counts, and the wall
    time of drafting and of verification."""

    tokens: list[int]
    drafted: int
    accepted: int
    draft_seconds: float
    target_seconds: float


def decode(log: RunLog, prompt: list[int], max_new_tokens: int, eos: int | None,
           step: Callable[[list[int], int], RoundResult], started: float, in_text: bool = True) -> RunLog:
    """The round loop every executor shares.

    ``step(context, budget)`` runs round ``len(log.rounds)`` on ``context`` (the prompt and
    the output so far), drafting at most ``budget`` tokens, and logs its calls and draft
    events. The loop cuts the round's new tokens at the budget and after ``eos``, appends
    them to ``log.output``, and records the round (:class:`draftsim.sim.records.Round`; its overhead is
    its wall time outside the calls it logged) until EOS or ``max_new_tokens`` ends the run.
    With ``in_text`` (chain drafts) the drafted and accepted counts are finally cut to the
    positions of the final text: a draft past its end is not positions of it. ``started`` is
    when the run began (``log.seconds`` counts from it).
    """
    context = list(prompt)
    while log.tokens < max_new_tokens:
        t0 = _now()
        first_call = len(log.calls)
        budget = max_new_tokens - log.tokens
        res = step(context, budget)
        new = res.tokens[:budget]
        ended = eos is not None and eos in new
        if ended:
            new = new[: new.index(eos) + 1]
        start = log.tokens
        log.output.extend(new)
        context.extend(new)
        in_calls = sum(c.seconds for c in log.calls[first_call:])
        log.rounds.append(Round(len(log.rounds), start, res.drafted, res.accepted, len(new), res.draft_seconds,
                                res.target_seconds, _now() - t0 - in_calls))
        if ended:
            break
    if in_text:
        for r in log.rounds:
            room = log.tokens - r.start
            r.drafted, r.accepted = min(r.drafted, room), min(r.accepted, room)
    log.seconds = _now() - started
    return log


# ---------------------------------------------------------------- chain drafting and verification

def prefill(target: CachedLM, prompt: list[int], log: RunLog) -> None:
    """The target reads everything but the prompt's last token (the first round feeds it) in
    a call of its own, timed and logged as the run's prefill (round −1)."""
    if len(prompt) > 1:
        dev = target.loaded.device
        sync(dev)
        t0 = _now()
        target.logits(prompt[:-1], 1)
        sync(dev)
        log.prefill_seconds = _now() - t0
        log.calls.append(Call(-1, 0, "prefill", target.fed, log.prefill_seconds))


class _Run:
    """One chain generation: the models, their caches, the rules and the log."""

    def __init__(self, target, drafters, policy, sampling, rule, rng, prompt_len, log):
        self.models = [target, *drafters]
        self.device = target.device  # the timed calls synchronise it (all models share it)
        self.lms = [CachedLM(target)] + [CachedLM(d.loaded) if d.neural else None for d in drafters]
        self.policy, self.sampling, self.rng, self.log = policy, sampling, rng, log
        self.top_rule = rule
        self.inner_rule = SD() if policy.leniency == 1.0 else Leniency(policy.leniency)
        # Distributions are carried along with tokens when sampling, or when a rule needs q.
        self.rows_needed = not sampling.greedy or not isinstance(rule, SD)
        self.has_stop = type(policy).stop is not Policy.stop
        self.prompt_len = prompt_len
        self.round = 0  # the round being run: its calls and draft events carry it
        self.state = policy.init(1)
        self._ahead: dict = {}  # model -> next-token logits already computed (acceptance heads)

    def release(self) -> None:
        """The generation is over: hand the models' caches back (static ones are reused)."""
        for lm in self.lms:
            if lm is not None:
                lm.release()

    def call(self, model: int, kind: str, fn):
        """Run ``fn`` — a forward call of ``model``, or a statistical drafter's proposal — and log it."""
        sync(self.device)  # nothing queued before counts
        t0 = _now()
        out = fn()
        sync(self.device)  # the call's kernels have run (CUDA is asynchronous)
        seconds = _now() - t0
        lm = self.lms[model]
        self.log.calls.append(Call(self.round, model, kind, lm.fed if lm is not None else 0, seconds))
        return out

    def prefill(self, prompt: list[int]) -> None:
        """Feed the target everything but the prompt's last token (the first round feeds it)."""
        self.round = -1
        prefill(self.lms[0], prompt, self.log)

    def step(self, context: list[int], budget: int) -> RoundResult:
        """One round (:func:`decode`): build the policy's draft, verify it with the target."""
        self.round = len(self.log.rounds)
        t0 = _now()
        draft = self.build(self.policy.begin_round(self.state), context, budget=budget)
        t1 = _now()
        logits = self.call(0, "verify", lambda: self.lms[0].logits(context + draft.tokens, len(draft) + 1))
        if self.round == 0:  # the prompt tokens the target had not seen rode on this call
            self.log.calls[-1].prompt_tokens = self.lms[0].fed - (len(draft) + 1)
        n, token, _ = self.verify(0, draft, logits, self.top_rule, context)
        t2 = _now()
        self.policy.end_round(self.state, np.array([len(draft)]), np.array([n]))
        for d in self.models[1:]:
            d.feedback(n)
        return RoundResult(draft.tokens[:n] + [token], len(draft), n, t1 - t0, t2 - t1)

    # ------------------------------------------------------------ drafting

    def build(self, plan: tuple[Block, ...], context: list[int], budget: int | None = None) -> "_Draft":
        """The draft ``plan`` proposes to its verifier: tokens, their proposal rows (or None),
        proposers and confidences. At the top level (``budget`` given) the draft is cut at
        ``budget`` tokens and the policy's ``stop`` is asked after each token."""
        out = _Draft()
        for block in plan:
            steps = int(np.asarray(block.steps).reshape(-1)[0])
            statistical = not block.inner and self.lms[block.model] is None
            for _ in range(1 if statistical else steps):
                room = None if budget is None else budget - len(out)
                if room is not None and room <= 0:
                    return out
                before = len(out)
                if block.inner:
                    part = self.speculative_round(block.model, block.inner, context + out.tokens)
                elif statistical:  # proposes all of the block's steps at once (cost ~ 0)
                    part = self.propose(block.model, context + out.tokens, steps if room is None else min(steps, room))
                else:
                    part = self.draft(block.model, context + out.tokens)
                part.blocks = [block.model] * len(part)
                out.extend(part)
                if budget is not None:
                    out.truncate(budget)
                    if self.has_stop and self._stopped(out, before):
                        return out
        return out

    def _stopped(self, out: "_Draft", before: int) -> bool:
        for i in range(before, len(out)):
            conf = np.array([out.confs[i]])
            stop = self.policy.stop(self.state, i, {"prob": out.confs[i], "pred": np.array([out.preds[i]]), "conf": conf})
            if stop is not None and bool(np.asarray(stop).reshape(-1)[0]):
                out.truncate(i + 1)
                return True
        return False

    def draft(self, m: int, context: list[int]) -> "_Draft":
        """One token from neural drafter ``m`` (one forward call). A drafter with an
        acceptance head ([SD++]) feeds its token at once: the hidden state there gives the
        head's prediction p̂, and the logits are kept for the next token."""
        drafter, lm = self.models[m], self.lms[m]
        ahead = self._ahead.pop(m, None)
        if ahead is not None and lm.ids == context:
            logits = ahead
        else:
            logits = self.call(m, "draft", lambda: lm.logits(context, 1))[0]
        tok, row, conf = self._pick(logits)
        pred = conf
        if drafter.head is not None:
            nxt, hidden = self.call(m, "draft", lambda: lm.logits(context + [tok], 1, hidden=True))
            pred = float(drafter.head.predict(hidden)[0])
            self._ahead[m] = nxt[0]
        return _Draft().add(tok, row, m, conf, pred)

    def propose(self, m: int, context: list[int], steps: int) -> "_Draft":
        """``steps`` tokens from statistical drafter ``m`` (Max-Gram, bigram) in one proposal,
        each with the drafter's confidence (:attr:`draftsim.realrun.drafters.Rows.conf`)."""
        drafter = self.models[m]
        tokens, q = self.call(m, "draft", lambda: drafter.propose(context, steps, prompt_len=self.prompt_len))
        confs = q.conf if q.conf is not None else q.prob(tokens)
        out = _Draft()
        for i, (tok, conf) in enumerate(zip(tokens, confs)):
            out.add(tok, q.row(i) if self.rows_needed else None, m, conf)
        return out

    def _pick(self, logits):
        """A drafter's token from its logits: argmax (greedy) or a sample of the warped row."""
        import torch

        if self.sampling.greedy:
            tok = int(logits.argmax())
            if self.rows_needed:
                row = self.sampling.rows(logits[None, :])[0]
                return tok, row, float(row[tok])
            if self.has_stop:  # only the token's probability: no full row through numpy
                return tok, None, float(torch.softmax(logits.double(), -1)[tok])
            return tok, None, 1.0
        q = self.sampling.rows(logits[None, :])[0]
        tok = int(self.rng.choice(len(q), p=q / q.sum()))
        return tok, q, float(q[tok])

    # ------------------------------------------------------------ verification

    def speculative_round(self, m: int, plan: tuple[Block, ...], context: list[int]) -> "_Draft":
        """Model ``m`` verifies the draft ``plan`` builds (inner rule) and emits the accepted
        tokens plus its correction or bonus, each with the row it was proposed from."""
        inner = self.build(plan, context)
        logits = self.call(m, "verify", lambda: self.lms[m].logits(context + inner.tokens, len(inner) + 1))
        n, token, p_rows = self.verify(m, inner, logits, self.inner_rule, context)
        out = _Draft()
        for i in range(min(n + 1, len(inner))):
            tok = inner.tokens[i] if i < n else token
            who = inner.proposers[i] if i < n else m
            out.add(tok, self._proposal_row(inner.rows[i], p_rows, i), who, inner.confs[i] if i < n else self._conf(logits, p_rows, i, tok))
        if n == len(inner):  # every inner token accepted: the bonus comes from m's own row
            out.add(token, None if p_rows is None else p_rows[n], m, self._conf(logits, p_rows, n, token))
        return out

    def _proposal_row(self, q_row, p_rows, i):
        """The distribution a token emitted by an inner verification was proposed from: the
        inner rule's output over (q, p) when sampling; the verifier's row when greedy."""
        if p_rows is None:
            return None
        return self.inner_rule.output(q_row, p_rows[i]) if not self.sampling.greedy else p_rows[i]

    def _conf(self, logits, p_rows, i, tok) -> float:
        if p_rows is not None:
            return float(p_rows[i][tok])
        if not self.has_stop:
            return 1.0
        import torch

        return float(torch.softmax(logits[i].double(), -1)[tok])

    def verify(self, verifier: int, draft: "_Draft", logits, rule: Rule, context: list[int]):
        """Accepted count and next token; logs each drafted token's fate. Also returns the
        verifier's rows (None when greedy SD needs only argmax ids)."""
        tokens = np.array(draft.tokens, dtype=np.int64)
        p_rows = None
        if self.sampling.greedy and isinstance(rule, SD) and not self.rows_needed:
            res = verify_greedy_ids(tokens, logits.argmax(dim=-1).cpu().numpy())
        else:
            p_rows = self.sampling.rows(logits)
            q = np.stack(draft.rows) if len(draft) and draft.rows[0] is not None else None
            if self.sampling.greedy:
                res = verify_block_greedy(tokens, p_rows, rule, q, validate=False)
            else:
                res = verify_block(tokens, q if q is not None else np.zeros((0, p_rows.shape[1])), p_rows, rule, self.rng, validate=False)
        n = int(res.n_accepted)
        start = len(context) - self.prompt_len
        r, events = self.round, self.log.drafts
        for i, tok in enumerate(draft.tokens):
            events.append(DraftEvent(r, verifier, draft.proposers[i], draft.blocks[i], start + i, i, tok, draft.confs[i], draft.preds[i], i < n))
        return n, int(res.token), p_rows


@dataclass(slots=True)
class _Draft:
    tokens: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    proposers: list = field(default_factory=list)
    confs: list = field(default_factory=list)
    preds: list = field(default_factory=list)  # acceptance predictions (the confidence without a head)
    blocks: list = field(default_factory=list)  # per token: the model of the plan block it came out of

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, tok, row, proposer, conf, pred=None):
        self.tokens.append(int(tok))
        self.rows.append(row)
        self.proposers.append(int(proposer))
        self.confs.append(float(conf))
        self.preds.append(float(conf if pred is None else pred))
        return self

    def extend(self, other: "_Draft"):
        for f in ("tokens", "rows", "proposers", "confs", "preds", "blocks"):
            getattr(self, f).extend(getattr(other, f))

    def truncate(self, n: int):
        for f in ("tokens", "rows", "proposers", "confs", "preds", "blocks"):
            del getattr(self, f)[n:]


# ---------------------------------------------------------------- the executors

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
    *,
    drafters: list[Drafter] | None = None,
    prefill_apart: bool = True,
) -> RunLog:
    """Generate up to ``max_new_tokens`` after ``prompt`` with ``policy`` (a :mod:`draftsim.sim.policies`
    chain policy; default autoregressive). ``drafters`` are models 1, 2, … of the policy
    (``drafter`` is shorthand for one).

    ``prefill_apart``: the target reads the prompt in a call of its own before the first round
    (a "prefill" :class:`~draftsim.sim.records.Call`, which :mod:`draftsim.sim.replay` prices apart); False: the
    prompt rides on the first round's verification — one forward call fewer, as transformers'
    ``generate`` does — whose :attr:`~draftsim.sim.records.Call.prompt_tokens` says how many it carried.

    With the lossless rule (SD, the default) greedy decoding reproduces the target's own
    greedy output exactly and sampling keeps the target's distribution, through any cascade
    and any inner leniency. Other rules give their π ([SC]).
    """
    policy = policy or Autoregressive()
    rule = rule or SD()
    if drafters is None:
        drafters = [] if drafter is None else [drafter]
    elif drafter is not None:
        raise DraftsimError("give drafter or drafters, not both")
    check_sampling(sampling, rng)
    _check_chain_policy(policy, drafters)
    check_drafters(target, drafters)
    check_context(target, prompt, max_new_tokens)
    started = _now()
    log = RunLog()
    run = _Run(target, drafters, policy, sampling, rule, rng, len(prompt), log)
    try:
        if prefill_apart:
            run.prefill(prompt)
        return decode(log, prompt, max_new_tokens, eos_id(target, stop_at_eos), run.step, started)
    finally:
        run.release()


def token_cascade(
    target: LoadedModel,
    drafter: NeuralDraft,
    prompt: list[int],
    max_new_tokens: int,
    rule: Rule,
    sampling: Sampling = Sampling(),
    rng: np.random.Generator | None = None,
    stop_at_eos: bool = True,
) -> RunLog:
    """The sequential token-level cascade ([SC] Algorithm 2): per token, the drafter's row q
    decides through the rule's deferral δ(q) whether to emit from q or to call the target
    and emit from p. Only rules whose deferral reads q alone can run this way
    (:attr:`draftsim.sim.rules.Rule.draft_only`: Chow); Diff, OPT and BiLD need p for every token,
    which is what speculative cascades give.

    Each target call catches up on the tokens the drafter emitted since its last call.
    """
    if not rule.draft_only:
        raise DraftsimError(f"the sequential cascade needs a rule that defers on the draft alone (chow); "
                            f"{rule!r} reads the target's distribution — run it as a speculative cascade")
    if not drafter.neural:
        raise DraftsimError("the sequential cascade needs a neural drafter (its confidence decides deferral)")
    check_sampling(sampling, rng)
    check_drafters(target, [drafter])
    check_context(target, prompt, max_new_tokens)
    started = _now()
    log = RunLog()
    run = _Run(target, [drafter], _ONE_TOKEN, sampling, rule, rng, len(prompt), log)

    def step(context: list[int], budget: int) -> RoundResult:
        run.round = len(log.rounds)
        t0 = _now()
        q_logits = run.call(1, "draft", lambda: run.lms[1].logits(context, 1))
        q = Sampling(1.0).rows(q_logits) if sampling.greedy else sampling.rows(q_logits)
        defer = bool(rule.defer(q, q)[0])
        t1 = _now()
        logits = run.call(0, "verify", lambda: run.lms[0].logits(context, 1)) if defer else q_logits
        rows = sampling.rows(logits)[0]
        tok = int(logits[0].argmax()) if sampling.greedy else int(rng.choice(len(rows), p=rows / rows.sum()))
        conf = float(q[0].max())
        log.drafts.append(DraftEvent(run.round, 0, 1, 1, len(context) - len(prompt), 0, tok, conf, conf, not defer))
        return RoundResult([tok], 1, int(not defer), t1 - t0, _now() - t1 if defer else 0.0)

    try:
        return decode(log, prompt, max_new_tokens, eos_id(target, stop_at_eos), step, started)
    finally:
        run.release()
