"""sim.serving.rounds: the round book every request's speculative rounds are read from.

Stated here: a request's rounds emit exactly what its quota needs (the last round may
overshoot), each round is consistent (accepted <= drafted, emitted = accepted + 1 for one
drafter), and a request's rounds depend on the seed, the replication and its block only —
not on which blocks were drawn first. That the book reproduces the Monte Carlo engine and
replays traces is tested in tests/sim/serving/test_server.py
(test_one_request_reproduces_the_monte_carlo_engine) and tests/sim/serving/test_workload.py
(test_trace_driven_requests_replay_their_recorded_sequences).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsim.sim import acceptance, policies
from draftsim.sim.serving.rounds import BLOCK, RoundBook


def rounds_of(book: RoundBook, rid: int) -> tuple[np.ndarray, ...]:
    s = slice(book.start[rid], book.start[rid] + book.count[rid])
    return book.drafted[s].copy(), book.accepted[s].copy(), book.emitted[s].copy(), book.calls[s].copy()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=40), st.integers(0, 8), st.floats(0.0, 1.0), st.integers(0, 10_000))
def test_rounds_meet_each_quota_exactly(quota, k, alpha, seed):
    book = RoundBook(policies.FixedK(k), acceptance.Bernoulli(alpha), np.array(quota), seed=seed)
    for rid, q in enumerate(quota):
        book.ensure(rid)
        d, a, e, calls = rounds_of(book, rid)
        assert e.sum() >= q and (len(e) == 0 or e[:-1].sum() < q)  # no round after the quota is met
        assert np.all((0 <= a) & (a <= d) & (d <= k))
        assert np.all(e == a + 1)  # accepted tokens plus the correction or bonus
        assert np.all(calls[:, 0] == d) if k else calls.shape[1] == 1


def test_rounds_depend_on_seed_replication_and_block_only():
    quota = np.full(BLOCK + 10, 50)
    quota[::7] = 5

    def book(seed=3, replication=0):
        return RoundBook(policies.FixedK(4), acceptance.Bernoulli(0.7), quota, seed=seed, replication=replication)

    first, second = book(), book()
    first.ensure(0)
    first.ensure(BLOCK + 3)
    second.ensure(BLOCK + 3)  # block 1 drawn before block 0
    second.ensure(0)
    for rid in (0, 6, 7, BLOCK, BLOCK + 3):
        for x, y in zip(rounds_of(first, rid), rounds_of(second, rid)):
            np.testing.assert_array_equal(x, y)
    other = book(replication=1)
    other.ensure(0)
    assert any(not np.array_equal(x, y) for rid in range(20) for x, y in zip(rounds_of(first, rid), rounds_of(other, rid)))


def test_extend_keeps_the_unused_rounds_first():
    book = RoundBook(policies.FixedK(3), acceptance.Bernoulli(0.6), np.array([40]), seed=0)
    book.ensure(0)
    d, a, e, _ = rounds_of(book, 0)
    book.extend(0, 25)
    d2, a2, e2, _ = rounds_of(book, 0)
    np.testing.assert_array_equal(e2[: len(e)], e)
    assert e2[len(e):].sum() >= 25 and np.all(a2 <= d2)


def test_cascade_rounds_record_every_drafters_calls():
    K = [[0, 3, 0], [0, 0, 4], [0, 0, 0]]
    process = acceptance.Bernoulli(np.array([[0, 0, 0], [0.8, 0, 0], [0.5, 0.6, 0]]))
    book = RoundBook(policies.VerticalCascade(K), process, np.array([60, 60]), seed=1)
    book.ensure(1)
    d, a, e, calls = rounds_of(book, 1)
    assert calls.shape[1] == 2 and np.all(calls[:, 0] >= 1) and np.all(calls[:, 1] >= 0)
    assert np.all(a <= d) and e.sum() >= 60
