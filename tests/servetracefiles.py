"""A serving trace written by the server's own writer, for the reader tests
(tests/test_readers.py, tests/test_fuzz.py): no model runs."""

from __future__ import annotations


def serving_trace(path, n: int = 4):
    """A complete serving trace of ``n`` requests written by the server's own writer
    (:class:`draftsim.realrun.servetrace.ServeTraceWriter`): each request a prefill and two rounds
    drafting 2 tokens (1 accepted)."""
    from types import SimpleNamespace

    from draftsim.realrun.servetrace import Member, RequestRecord, ServeTraceWriter, Step, TokenRecord

    meta = {"target": "smollm2", "drafter": "maxgram", "policy": "fixed:k=2", "controller": "none", "sampling": {"mode": "greedy"},
            "seed": 0, "max_batch": 2, "requests": [[0.1 * i, 8, 4] for i in range(n)], "kv_tokens": None, "block_size": 16,
            "model": {"name": "smollm2", "dtype": "float32", "architecture": "llama"}, "machine": {"cpu": "x", "cores": 2, "device": "cpu"},
            "threads": 1, "device": "cpu"}
    steps, members, reqs, toks = [], [], [], []
    t, s = 0.0, 0
    for i in range(n):
        t = max(t, 0.1 * i)
        steps.append(Step(s, t, t + 0.01, 0, 1, 0, 0, 8, 0, 0, 1, -1, 0.0, 0.0, 0.008, 0.002, False, 0))
        members.append(Member(s, i, True, 8, 0, 0, 0, 1))
        toks.append(TokenRecord(i, 0, 5, t + 0.01, s))
        first, t, s = t + 0.01, t + 0.01, s + 1
        for r in range(2):
            steps.append(Step(s, t, t + 0.01, 1, 0, 3, 8 + 2 * r, 0, 2, 1, 2, 2, 0.001, 0.007, 0.0, 0.002, False, 0))
            members.append(Member(s, i, False, 3, 8 + 2 * r, 2, 1, 2 if r == 0 else 1))
            toks.append(TokenRecord(i, 1 + r, 5, t + 0.01, s))
            t, s = t + 0.01, s + 1
        reqs.append(RequestRecord(i, 0.1 * i, 8, 4, 4, 0.1 * i, first, t, s - 3))
    ServeTraceWriter(path, meta).close(SimpleNamespace(steps=steps, members=members, requests=reqs, tokens=toks))
    return path
