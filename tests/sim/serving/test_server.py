"""sim.serving.server: ServingConfig, serve and run_replications.

The configuration's checks, the KV pool it derives, replications and their streams; then the
server under load: exactness against the Monte Carlo engine and queueing theory, every token
once across preemptions, determinism, routers, and properties under random configurations.
Controllers under load are tested in tests/sim/test_controllers.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from draftsim.sim import acceptance, des, montecarlo, policies
from draftsim.sim.controllers import parse_controller
from draftsim.sim.cost import CallCost, Costs, RooflineModel, default_catalog
from draftsim.sim.errors import DraftsimError
from draftsim.sim.serving import (
    SchedulerConfig,
    ServingConfig,
    run_replications,
    serve,
    summarize_run,
    workload_stream,
)
from draftsim.sim.serving.rounds import round_stream
from draftsim.sim.serving.scheduler import SCHEDULING_POLICIES
from draftsim.sim.serving.workload import ClosedLoop, Fixed, Poisson, Workload, make_workload, parse_arrivals, parse_lengths

TARGET, DRAFTER = CallCost(0.02, 1e-4), CallCost(0.002)


def config(**kw) -> ServingConfig:
    kw.setdefault("kv_tokens", 1 << 16)
    return ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), TARGET, [DRAFTER], **kw)


def draw(rng, n=30) -> Workload:
    return make_workload(arrivals=Poisson(), qps=4.0, requests=n, duration=None, prompt=Fixed(64), output=Fixed(32), rng=rng)


@pytest.mark.parametrize("kw, match", [
    (dict(replicas=0), "replicas"),
    (dict(router="random"), "unknown router"),
    (dict(kv_tokens=0), "kv_tokens"),
])
def test_config_ranges(kw, match):
    with pytest.raises(DraftsimError, match=match):
        config(**kw)


def test_a_drafter_cost_per_drafter():
    with pytest.raises(DraftsimError, match="uses 2 drafter\\(s\\); give a cost model for each \\(got 1\\)"):
        ServingConfig(policies.VerticalCascade([[0, 2, 0], [0, 0, 3], [0, 0, 0]]), acceptance.Bernoulli(0.8), TARGET, [DRAFTER])


def test_kv_pool_from_tokens_or_from_the_hardware():
    kv, plan = config(kv_tokens=1000, scheduler=SchedulerConfig(block_size=16)).kv_cache()
    assert (kv.blocks, kv.block_size, kv.lookahead, plan) == (62, 16, 5, None)
    assert config(kv_tokens=None).kv_cache() == (None, None)  # linear costs know no memory: unlimited
    with pytest.raises(DraftsimError, match="less than one block of 16"):
        config(kv_tokens=15).kv_cache()
    cat = default_catalog()
    hw = cat.hardware_spec("h100-sxm")
    roof = ServingConfig(policies.FixedK(4), acceptance.Bernoulli(0.8), RooflineModel(cat.model("llama-2-7b"), hw),
                         [RooflineModel(cat.model("smollm2-135m"), hw)])
    kv, plan = roof.kv_cache()
    assert kv.blocks == plan.tokens // 16 and plan.tokens > 10_000


def test_check_refuses_what_cannot_be_served():
    wl = Workload(np.zeros(2), np.array([100, 3000]), np.array([10, 100]), np.zeros(2, dtype=np.int64))
    with pytest.raises(DraftsimError, match="memory too small for one request"):
        config(kv_tokens=2048).check(wl)
    with pytest.raises(DraftsimError, match="without chunked prefill a prefill .* up to 3,100"):
        config(scheduler=SchedulerConfig(max_num_batched_tokens=2048, chunked_prefill=False)).check(wl)
    config(scheduler=SchedulerConfig(max_num_batched_tokens=2048)).check(wl)  # chunked: fine


def test_serve_reports_progress_per_request_and_its_setup():
    done = []
    wl = draw(np.random.default_rng(0))
    run = serve(config(), wl, seed=1, progress=done.append)
    assert sum(done) == len(wl) and np.all(np.isfinite(run.finish))
    assert run.meta["policy"] == repr(policies.FixedK(4)) and run.kv_blocks == (1 << 16) // 16
    assert np.all(run.first_token >= run.arrival) and np.all(run.finish >= run.first_token)


def test_replications_draw_their_own_workloads_and_combine():
    seen = []

    def make(rng):
        wl = draw(rng)
        seen.append(wl.arrival.copy())
        return wl

    res = run_replications(config(), make, seed=5, replications=3, keep_runs=False)
    assert len(res.summaries) == 3 and len(res.runs) == 1 and res.summary["replications"] == 3
    assert not np.array_equal(seen[0], seen[1])
    np.testing.assert_array_equal(seen[0], draw(workload_stream(5, 0)).arrival)
    assert res.summary["ttft"]["mean"] == pytest.approx(np.mean([s["ttft"]["mean"] for s in res.summaries]))
    assert res.summary["ci95"]["ttft"]["mean"] > 0
    again = run_replications(config(), draw, seed=5, replications=3)
    assert [s["e2e"] for s in again.summaries] == [s["e2e"] for s in res.summaries] and len(again.runs) == 3
    with pytest.raises(DraftsimError, match="replications"):
        run_replications(config(), draw, replications=0)


# -- the server under load: exactness against the Monte Carlo engine and queueing theory, every token once ---

def serving_config(policy=None, process=None, target=TARGET, drafter=DRAFTER, **kw) -> ServingConfig:
    policy = policy or policies.FixedK(4)
    kw.setdefault("kv_tokens", 1 << 20)
    return ServingConfig(policy, process or acceptance.Bernoulli(0.8), target, [drafter] * (policy.n_models - 1), **kw)


def workload(n=200, qps=5.0, prompt=128, output=64, seed=0) -> Workload:
    return make_workload(arrivals=Poisson(), qps=qps, requests=n, duration=None, prompt=parse_lengths(str(prompt)),
                         output=parse_lengths(str(output)), rng=np.random.default_rng(seed))


def one_request(prompt: int, output: int) -> Workload:
    return Workload(np.zeros(1), np.array([prompt]), np.array([output]), np.zeros(1, dtype=np.int64))


@pytest.mark.parametrize("policy, process", [
    (policies.FixedK(4), acceptance.Bernoulli(0.8)),
    (policies.Threshold(0.6, k_max=8), acceptance.Positional([0.9, 0.8, 0.7, 0.5], pred_noise=0.3)),
    (policies.Heuristic(3, 10), acceptance.MarkovModulated([[0.9, 0.1], [0.2, 0.8]], [0.9, 0.4])),
])
def test_one_request_reproduces_the_monte_carlo_engine(policy, process):
    """Alone in the server, a request's rounds, tokens and decode time are the Monte Carlo
    engine's, each round timed by the cost model at its context."""
    N, P, seed = 300, 64, 5
    run = serve(serving_config(policy, process), one_request(P, N), seed=seed)
    counts, log = montecarlo.run(policy, process, 1, N - 1, round_stream(seed, 0, 0), log=True)
    calls = np.stack(log.calls)[:, 0]
    toks = np.stack(log.call_tokens)[:, 0]
    emitted = np.stack(log.emitted)[:, 0]
    keep = np.cumsum(emitted) - emitted < N - 1
    rounds = int(keep.sum())
    assert run.rounds[0] == rounds == counts.rounds[0]
    assert run.output[0] == N and run.prefills[0] == 1
    drafted = toks[keep, 0] - 1
    assert run.spec["num_draft_tokens"] == drafted.sum() == counts.top_drafted[0]
    assert run.spec["num_accepted_tokens"] == counts.top_accepted[0]
    # decode time: target call a + b(d+1), drafter calls at 0.002 each
    expected = (TARGET.a * keep.sum() + TARGET.b * (drafted + 1).sum() + DRAFTER.a * calls[keep, 1].sum())
    assert run.finish[0] - run.first_token[0] == pytest.approx(expected, rel=1e-12)
    prefill = TARGET.a + TARGET.b * P + DRAFTER.a
    assert run.first_token[0] == pytest.approx(prefill, rel=1e-12)
    # the discrete-event engine's timeline of the same rounds takes the same time (its time per
    # token divides by the last round's untruncated tokens; the server stops at N)
    alone = des.replay(log, Costs((TARGET, DRAFTER)), rng=np.random.default_rng(0))
    assert run.finish[0] - run.first_token[0] == pytest.approx(alone.finish[0], rel=1e-12)


def test_k0_equals_autoregressive_serving():
    wl = workload(n=150, qps=20.0)
    ar = serve(serving_config(policies.Autoregressive()), wl, seed=1)
    k0 = serve(serving_config(policies.FixedK(0)), wl, seed=1)
    np.testing.assert_array_equal(ar.finish, k0.finish)
    np.testing.assert_array_equal(ar.first_token, k0.first_token)
    assert k0.spec["num_draft_tokens"] == 0 and k0.spec["mean_acceptance_length"] == 1.0


@pytest.mark.slow  # 24.0 s measured (pytest --durations, 2-core machine)
def test_md1_mean_wait_matches_pollaczek_khinchine():
    """max_num_seqs = 1 and constant per-call costs: a deterministic server (D = output x a);
    mean queueing delay λD²/(2(1−ρ))."""
    a, out, lam = 0.01, 5, 8.0
    D = a * out
    rho = lam * D
    cfg = ServingConfig(policies.Autoregressive(), acceptance.Bernoulli(0.5), CallCost(a), [], kv_tokens=1 << 16,
                        scheduler=SchedulerConfig(max_num_seqs=1))
    wl = make_workload(arrivals=Poisson(), qps=lam, requests=20_000, duration=None, prompt=Fixed(16), output=Fixed(out),
                       rng=np.random.default_rng(3))
    run = serve(cfg, wl, seed=0)
    service = run.finish - run.admitted
    np.testing.assert_allclose(service, D, rtol=1e-9)
    waits = run.admitted - run.arrival
    # exactly the Lindley recursion of this sample path: W' = max(0, W + D - gap) ...
    lindley = np.zeros(len(waits))
    gaps = np.diff(wl.arrival)
    for i in range(1, len(waits)):
        lindley[i] = max(0.0, lindley[i - 1] + D - gaps[i - 1])
    np.testing.assert_allclose(waits, lindley, atol=1e-9)
    # ... whose mean is Pollaczek-Khinchine's (sampling error ~1-2% for 20,000 requests at ρ = 0.4)
    assert waits.mean() == pytest.approx(lam * D**2 / (2 * (1 - rho)), rel=0.05)


@pytest.mark.slow  # 7.2 s measured (pytest --durations, 2-core machine)
def test_littles_law_on_a_long_run():
    wl = workload(n=3000, qps=12.0, prompt=256, output=96, seed=2)
    run = serve(serving_config(scheduler=SchedulerConfig(max_num_seqs=16)), wl, seed=2)
    s = run.steps
    horizon = float(np.max(run.finish) - np.min(run.arrival))
    L = float(((s["batch"] + s["waiting"]) * s["duration"]).sum()) / horizon
    lam = len(run.finish) / horizon
    W = float((run.finish - run.arrival).mean())
    assert s["waiting"].max() > 0  # the queue was used
    # time-average of requests in the system, from the replica's own step records (running +
    # waiting), against λW from the requests' arrival and finish times
    assert L == pytest.approx(lam * W, rel=0.01)


def test_every_token_once_across_preemptions():
    """A KV pool far too small for the load: requests are preempted and recomputed, and each
    still emits exactly its output tokens — its prefills' tokens plus its rounds', in order."""
    wl = workload(n=300, qps=60.0, prompt=200, output=120, seed=4)
    cfg = serving_config(kv_tokens=2400, scheduler=SchedulerConfig(max_num_seqs=32, block_size=16))
    run = serve(cfg, wl, seed=4)
    assert run.preemptions.sum() > 20
    assert np.isfinite(run.finish).all()
    from draftsim.sim.serving.rounds import RoundBook

    book = RoundBook(cfg.policy, cfg.process, run.output - 1, seed=4)
    for rid in range(len(run.output)):
        book.ensure(rid)
        e = book.emitted[book.start[rid]: book.start[rid] + run.rounds[rid]].astype(np.int64)
        need = run.output[rid] - run.prefills[rid]
        assert e[:-1].sum() < need <= e.sum() or (run.rounds[rid] == 0 and need == 0)
    assert run.prefills.sum() > len(run.output)  # recomputed prefills emitted tokens too
    # one ITL value per emission but the first
    assert len(run.itl) == int((run.prefills + run.rounds).sum()) - len(run.output)
    assert run.steps["kv"].max() <= 2400 // 16


def test_same_seed_bit_identical():
    wl = workload(n=120, qps=30.0)
    cfg = serving_config(policies.Threshold(0.5), acceptance.MarkovModulated([[0.9, 0.1], [0.3, 0.7]], [0.9, 0.3]),
                 controller=parse_controller("goodput"), kv_tokens=6000)
    a, b = serve(cfg, wl, seed=9), serve(cfg, wl, seed=9)
    for name in ("arrival", "first_token", "finish", "rounds", "itl"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    for k in a.steps:
        assert np.array_equal(a.steps[k], b.steps[k])
    assert a.spec == b.spec
    c = serve(cfg, wl, seed=10)
    assert not np.array_equal(a.finish, c.finish)


def test_replicas_and_routers_serve_everything():
    wl = workload(n=200, qps=40.0)
    for router in ("round-robin", "least-outstanding"):
        run = serve(serving_config(replicas=3, router=router), wl, seed=0)
        assert np.isfinite(run.finish).all()
        assert set(np.unique(run.steps["replica"]).tolist()) == {0, 1, 2}


def test_closed_loop_clients():
    wl = make_workload(arrivals=parse_arrivals("closed:clients=4,think=0.05"), qps=None, requests=40, duration=None,
                       prompt=Fixed(64), output=Fixed(32), rng=np.random.default_rng(0))
    run = serve(serving_config(), wl, seed=0, arrivals=parse_arrivals("closed:clients=4,think=0.05"))
    assert np.isfinite(run.finish).all()
    assert run.steps["batch"].max() <= 4


@pytest.mark.parametrize("spec, process", [
    ("tree:width=2,depth=4", acceptance.Bernoulli(0.8, rank_alphas=[0.8, 0.4])),
    ("vertical:n=3,k=4", acceptance.Bernoulli([[0, 0, 0], [0.8, 0, 0], [0.7, 0.6, 0]])),
    ("horizontal:counts=2,3", acceptance.Bernoulli([[0, 0, 0], [0.8, 0, 0], [0.7, 0.6, 0]])),
    ("confidence:tau=0.5", acceptance.Bernoulli(0.8, conf_noise=0.5)),
    ("heuristic", acceptance.Positional([0.9, 0.8, 0.6])),
])
@pytest.mark.parametrize("controller", ["none", "table:k=1-3:2,4-:1"])
@pytest.mark.slow  # 20.9 s measured (pytest --durations, 2-core machine, total of 25 items)
@pytest.mark.parametrize("scheduler", [SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512),
                                       SchedulerConfig(policy="priority", chunked_prefill=False, max_num_batched_tokens=1024)])
def test_every_policy_controller_and_scheduler_serves_everything(spec, process, controller, scheduler):
    """The shared policy objects (trees, cascades, stopping rules, stateful schedules) under
    caps, small KV pools, priorities and whole-prompt prefills: every request finishes with
    exactly its tokens, and a K table's cap holds in every step."""
    policy = policies.parse_policy(spec)
    wl = make_workload(arrivals=Poisson(), qps=20, requests=60, duration=None, prompt=parse_lengths("uniform:32,500"),
                       output=parse_lengths("uniform:4,150"), rng=np.random.default_rng(0), priorities=3)
    cfg = ServingConfig(policy, process, TARGET, [DRAFTER, CallCost(0.0005)][: policy.n_models - 1], kv_tokens=3000,
                        controller=parse_controller(controller), scheduler=scheduler)
    run = serve(cfg, wl, seed=1)
    assert np.isfinite(run.finish).all() and (run.finish >= run.first_token).all()
    assert len(run.itl) == int((run.prefills + run.rounds).sum()) - len(run.output)
    if controller != "none":
        per_pos = run.spec["num_accepted_tokens_per_pos"]
        assert all(x == 0 for x in per_pos[2:])  # at most 2 accepted tokens under the table's caps


# -- properties under load --------------------------------------------------------------------------

@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), factor=st.floats(0.3, 0.95), qps=st.floats(2.0, 30.0))
def test_more_load_never_lowers_mean_latency(seed, factor, qps):
    """Common random numbers: the same requests and rounds, arrivals compressed by ``factor``.
    The property is about every request's latency, so the mean is over all of them (the
    steady-state window would pick a different sample of requests at each load)."""
    wl = workload(n=60, qps=qps, seed=seed)
    busier = Workload(wl.arrival * factor, wl.prompt, wl.output, wl.priority)
    cfg = serving_config(kv_tokens=None)
    base = summarize_run(serve(cfg, wl, seed=seed), steady=False)["e2e"]["mean"]
    more = summarize_run(serve(cfg, busier, seed=seed), steady=False)["e2e"]["mean"]
    assert more >= base - 1e-12


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), cheaper=st.floats(0.0, 0.99), clients=st.integers(1, 48))
def test_a_cheaper_draft_never_lowers_throughput(seed, cheaper, clients):
    """Throughput as the server's capacity: closed-loop clients keep it saturated (common random
    numbers: the same requests and rounds). Open-loop throughput is the offered load, and at
    low load the step boundaries an arrival catches shift with the step times, so the last
    finish — and tokens / (last finish − first arrival) — may move either way by a fraction
    of a step (hypothesis found such a case: -0.05% at 4.5 req/s)."""
    arr = ClosedLoop(clients)
    wl = make_workload(arrivals=arr, qps=None, requests=60, duration=None, prompt=parse_lengths("uniform:16,256"),
                       output=parse_lengths("uniform:8,128"), rng=np.random.default_rng(seed))
    slow = summarize_run(serve(serving_config(drafter=CallCost(0.004), kv_tokens=None), wl, seed=seed, arrivals=arr))
    fast = summarize_run(serve(serving_config(drafter=CallCost(0.004 * cheaper), kv_tokens=None), wl, seed=seed, arrivals=arr))
    assert fast["throughput"] >= slow["throughput"] - 1e-9


@settings(max_examples=25, deadline=None)
@pytest.mark.slow  # 9.4 s measured (pytest --durations, 2-core machine)
@given(seed=st.integers(0, 10_000), qps=st.floats(1.0, 200.0), kv=st.integers(700, 20_000), seqs=st.integers(1, 40),
       budget=st.integers(64, 4096), chunked=st.booleans(), queue=st.sampled_from(SCHEDULING_POLICIES),
       policy=st.sampled_from(["ar", "fixed:k=3", "threshold:h=0.5,kmax=6", "heuristic:k=2,kmax=8"]),
       controller=st.sampled_from(["none", "goodput", "disable:above=4", "table:k=1-2:3,3-:1"]))
def test_invariants_under_random_configurations(seed, qps, kv, seqs, budget, chunked, queue, policy, controller):
    """Whatever the limits: every request finishes, after it arrived and got its first token,
    with exactly its tokens (prefills' + rounds' in order); the KV pool is never overdrawn."""
    pol = policies.parse_policy(policy)
    assume(not (policy == "ar" and controller == "goodput"))  # refused: nothing to tune
    prompt_max = min(600, kv // 2) if chunked else min(600, budget - 200, kv // 2)
    if prompt_max < 8:
        return
    wl = make_workload(arrivals=Poisson(), qps=qps, requests=40, duration=None, prompt=parse_lengths(f"uniform:1,{prompt_max}"),
                       output=parse_lengths("uniform:1,150"), rng=np.random.default_rng(seed), priorities=3)
    cfg = ServingConfig(pol, acceptance.MarkovModulated([[0.9, 0.1], [0.3, 0.7]], [0.9, 0.4], pred_noise=0.3), TARGET,
                        [DRAFTER] * (pol.n_models - 1), kv_tokens=kv, controller=parse_controller(controller),
                        scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget, chunked_prefill=chunked,
                                                  policy=queue))
    run = serve(cfg, wl, seed=seed)
    assert np.isfinite(run.finish).all()
    assert (run.admitted >= run.arrival).all() and (run.first_token > run.admitted).all() and (run.finish >= run.first_token).all()
    assert len(run.itl) == int((run.prefills + run.rounds).sum()) - len(run.output) and (run.itl > 0).all()
    assert run.steps["kv"].max() <= kv // 16
    assert run.steps["batch"].max() <= seqs
    from draftsim.sim.serving.rounds import RoundBook

    book = RoundBook(cfg.policy, cfg.process, run.output - 1, seed=seed)
    for rid in range(len(run.output)):
        book.ensure(rid)
        if run.rounds[rid] > book.count[rid]:
            continue  # a capped request drew more rounds (elsewhere in the book)
        e = book.emitted[book.start[rid]: book.start[rid] + run.rounds[rid]].astype(np.int64)
        need = run.output[rid] - run.prefills[rid]
        if controller == "none" or pol.max_draft == 0:
            assert (run.rounds[rid] == 0 and need == 0) or e[:-1].sum() < need <= e.sum()
