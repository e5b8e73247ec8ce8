"""Capacity search (analysis.capacity, draftsim capacity): bracketing + bisection against
known answers, an M/D/1 server against the Pollaczek–Khinchine closed form, the command end to
end on the discrete-event executor, malformed capacity specs."""

from __future__ import annotations

import json
import math
import tomllib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftsim.analysis import capacity as cap
from draftsim.analysis import sweep as sw
from draftsim.cli import main
from draftsim.sim.errors import DraftsimError
from draftsim.sweepkinds import KINDS

#: Two configurations (no speculation, k = 4) of the discrete-event executor: 40 requests of 100
#: tokens; SLO on the mean latency (in target-call times).
DES_SPEC = """
version = 1
kind = "simulate"
seed = 4
replications = 2
[base]
executor = "des"
alpha = 0.8
cost = [0.05]
requests = 40
tokens = 4000
[grid]
policy = ["fixed:k=0", "fixed:k=4"]
[capacity]
slo = { latency_mean = 400.0 }
start = 0.001
minimum = 0.0001
tolerance = 0.05
throughput = "throughput"
price_per_hour = 3.0
"""


@pytest.mark.parametrize("true_cap,start", [(7.3, 1.0), (0.37, 1.0), (123.0, 50.0), (1.0, 1.0)])
def test_bisection_finds_a_known_threshold(true_cap, start):
    calls = []

    def evaluate(q):
        calls.append(q)
        return q <= true_cap, {"q": q}

    c = cap.find_capacity(evaluate, start=start, minimum=1e-3, maximum=1e4, tolerance=0.01)
    assert c.low <= true_cap < c.high and c.high / c.low - 1 <= 0.01
    assert c.qps == c.low and c.metrics == {"q": c.qps}
    assert len(calls) == len(c.evaluations) <= 2 + abs(math.log2(true_cap / start)) + math.log2(1 / 0.01) + 2


@given(threshold=st.floats(1e-2, 1e3), start=st.floats(1e-2, 1e3), tolerance=st.floats(1e-3, 0.5))
def test_bisection_brackets_any_threshold(threshold, start, tolerance):
    """For any monotone SLO (met iff qps <= threshold) inside [minimum, maximum], the answer
    meets it, the bracket's upper end does not, and the bracket is within the tolerance."""
    c = cap.find_capacity(lambda q: (q <= threshold, {}), start=start, minimum=1e-3, maximum=1e4, tolerance=tolerance)
    assert c.qps <= threshold < c.high and c.high / c.qps - 1 <= tolerance + 1e-12
    assert all(ok == (q <= threshold) for q, ok, _ in c.evaluations)


def test_bisection_edges():
    never = cap.find_capacity(lambda q: (False, {}), start=1.0, minimum=0.01, maximum=10)
    assert never.qps == 0.0 and never.high == 0.01
    always = cap.find_capacity(lambda q: (True, {"q": q}), start=1.0, minimum=0.01, maximum=10)
    assert always.qps == 10 and math.isinf(always.high)
    with pytest.raises(DraftsimError, match="did not converge in 5 evaluations"):
        cap.find_capacity(lambda q: (q < 3.3, {}), tolerance=1e-6, max_evaluations=5)
    with pytest.raises(DraftsimError, match="minimum <= start <= maximum"):
        cap.find_capacity(lambda q: (True, {}), start=0.0)


def md1_mean_wait(qps: float, seed: int, service: float = 1.0, customers: int = 20000) -> dict:
    """A capacity-1 FCFS server with deterministic service and Poisson arrivals (M/D/1),
    simulated by Lindley's recursion W_{n+1} = max(0, W_n + D - A_{n+1}); the mean wait after
    a warm-up of one tenth."""
    gaps = np.random.default_rng(seed).exponential(1.0 / qps, customers)
    wait, waits = 0.0, np.empty(customers)
    for n in range(customers):
        waits[n] = wait
        wait = max(0.0, wait + service - gaps[n])
    return {"wait_mean": float(waits[customers // 10:].mean())}


@pytest.mark.parametrize("bound", [0.5, 2.0])
def test_capacity_of_md1_matches_pollaczek_khinchine(bound):
    """Mean M/D/1 wait W = rho D / (2 (1 - rho)), rho = lambda D, so the largest rate with
    W <= bound is lambda* = 2 bound / (D (D + 2 bound)) (D = 1)."""
    exact = 2 * bound / (1 + 2 * bound)
    evaluate = cap.replicated(md1_mean_wait, seeds=[1, 2, 3, 4], slo={"wait_mean": bound})
    c = cap.find_capacity(evaluate, start=0.1, minimum=0.01, maximum=0.999, tolerance=0.005)
    assert c.qps == pytest.approx(exact, rel=0.03)
    assert c.metrics["wait_mean"] <= bound


def test_replicated_with_bools_and_bad_returns():
    ev = cap.replicated(lambda q, s: q < 2 + s, seeds=[0, 1])
    assert ev(1.5) == (True, {"fraction_meeting": 1.0})
    assert ev(2.5) == (False, {"fraction_meeting": 0.5})
    with pytest.raises(DraftsimError, match="give the SLO bounds"):
        cap.replicated(lambda q, s: {"x": 1.0}, seeds=[0])(1.0)
    with pytest.raises(DraftsimError, match="did not report SLO metric"):
        cap.replicated(lambda q, s: {"x": 1.0}, seeds=[0], slo={"y": 1.0})(1.0)
    nan = cap.replicated(lambda q, s: {"x": None}, seeds=[0], slo={"x": 1.0})
    assert nan(1.0)[0] is False


@pytest.mark.slow  # 12.8 s measured (pytest --durations, 2-core machine)
def test_capacity_command_end_to_end(tmp_path, capsys):
    spec = tmp_path / "cap.toml"
    spec.write_text(DES_SPEC)
    out = tmp_path / "out"
    assert main(["capacity", str(spec), "--out", str(out), "--workers", "2"]) == 0
    text = capsys.readouterr().out
    assert "capacity (latency_mean <= 400; mean over 2 replication(s), tolerance 5%)" in text
    assert "$ per 1M tokens" in text and (out / "capacity.png").stat().st_size > 1000
    costs = dict(zip(sw.load(out).column("policy").to_pylist(), sw.load(out).column("cost_per_million_tokens").to_pylist()))
    assert costs["fixed:k=4"] < costs["fixed:k=0"]
    assert f"cheapest per output token at capacity: policy=fixed:k=4: {costs['fixed:k=4']:.4g} per 1M tokens" in text
    table = sw.load(out)
    rows = {p: i for i, p in enumerate(table.column("policy").to_pylist())}
    capq = table.column("capacity_qps").to_pylist()
    mean = table.column("latency_mean_at_capacity").to_pylist()
    assert all(m <= 400 for m in mean), table.to_pylist()
    # speculation (k = 4 at alpha 0.8, c = 0.05) serves each request ~2.8x faster: more capacity
    assert capq[rows["fixed:k=4"]] > 1.5 * capq[rows["fixed:k=0"]]
    # processor sharing with 100-call requests: E[T] = D / (1 - rho) <= 400 at rho <= 0.75, so
    # the capacity of k = 0 is near 0.0075 requests per call time (40 requests: a short run)
    assert 0.004 < capq[rows["fixed:k=0"]] < 0.011
    # one worker: the same results, bit for bit
    spec2 = tmp_path / "cap2.toml"
    spec2.write_text(DES_SPEC)
    assert main(["capacity", str(spec2), "--out", str(tmp_path / "one"), "--workers", "1", "--json"]) == 0
    one = sw.load(tmp_path / "one")
    for c in table.column_names:
        if c not in ("seconds", "cpu_seconds"):
            assert one.column(c).to_pylist() == table.column(c).to_pylist(), c


def test_capacity_resumes_without_searching_again(tmp_path, capsys):
    spec = tmp_path / "cap.toml"
    spec.write_text(DES_SPEC.replace('policy = ["fixed:k=0", "fixed:k=4"]', 'policy = ["fixed:k=2"]'))
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    first = sw.load(tmp_path / "out").to_pylist()
    capsys.readouterr()
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out"), "--resume", "--json"]) == 0
    assert '"ran": 0' in capsys.readouterr().out
    assert sw.load(tmp_path / "out").to_pylist() == first


@pytest.mark.parametrize("edit,message", [
    (("[capacity]\nslo = { latency_mean = 400.0 }", "[capacity]\nmax_evaluations = 10"), "slo must be a table"),
    (("latency_mean = 400.0", "speed = 1.0"), "unknown metric 'speed'"),
    (("latency_mean = 400.0", "latency_mean = -1.0"), "slo.latency_mean must be a finite number > 0"),
    (("tolerance = 0.05", "tolerance = 0.05\nqps = 3"), "unknown [capacity] key 'qps'"),
    (("requests = 40", "requests = 40\nrate = 0.1"), "the capacity search sets rate"),
    (("start = 0.001", "start = 0.00001"), "minimum <= start <= maximum"),
    (('executor = "des"\n', ""), "--rate applies to the discrete-event executor"),
])
def test_malformed_capacity_specs(tmp_path, capsys, edit, message):
    spec = tmp_path / "cap.toml"
    spec.write_text(DES_SPEC.replace(*edit))
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_settings_need_a_rate_option():
    spec = sw.parse_spec(tomllib.loads('version = 1\nkind = "optimize"\n[base]\nwhat = "tree"\n[capacity]\nslo = { oracle = 1 }\n'), KINDS)
    with pytest.raises(DraftsimError, match="has no request-rate option"):
        cap.settings(spec, KINDS["optimize"])


SERVE_SPEC = """
version = 1
kind = "serve"
seed = 3
[base]
target = "qwen2.5-7b"
drafter = ["qwen2.5-0.5b"]
hardware = "h100-sxm"
engine = "none"  # the bare roofline these searches' numbers were derived on
alpha = 0.8
duration = 4.0
prompt-len = "fixed:256"
output-len = "fixed:64"
replications = 1
[grid]
policy = ["ar", "fixed:k=4"]
[capacity]
slo = { tpot_p50 = 0.008 }
start = 4.0
tolerance = 0.1
devices = ["tp"]
price_per_hour = 2.0
"""

#: SERVE_SPEC's configurations as every capacity output names them (frontdoor.point_names: the answer's names,
#: from a hand-written spec as from the front door's)
SERVE_NAMES = {"ar": "plain decoding", "fixed:k=4": "draft model qwen2.5-0.5b with k = 4"}

@pytest.mark.slow  # 11.1 s measured (pytest --durations, 2-core machine)
def test_capacity_with_the_serving_simulator(tmp_path, capsys):
    """The serve kind: at capacity the SLO holds; just above it (the bracket's upper end) it
    does not; speculation lowers TPOT at light load, so it serves more under a tight TPOT SLO."""
    spec = tmp_path / "serve.toml"
    spec.write_text(SERVE_SPEC)
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out"), "--workers", "2", "--json"]) == 0
    table = sw.load(tmp_path / "out")
    rows = table.to_pylist()
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    for r in rows:
        assert 0 < r["capacity_qps"] < r["bracket_high"] <= r["capacity_qps"] * 1.1 + 1e-9
        assert r["tpot_p50_at_capacity"] <= 0.008 and r["throughput_at_capacity"] > 0
        assert r["cost_per_million_tokens"] == pytest.approx(2.0 / (r["throughput_at_capacity"] * 3600) * 1e6)
        above = KINDS["serve"].run({**sw.parse_spec(tomllib.loads(SERVE_SPEC), KINDS).base, "policy": r["policy"],
                                    "qps": r["bracket_high"]}, sw.derive_seed(3, r["point"], 0))
        assert above.summary.tpot.p50 > 0.008
    ar, spec_k4 = rows
    assert spec_k4["capacity_qps"] > ar["capacity_qps"]


def test_replicas_for_a_target_load(tmp_path, capsys):
    """[capacity] load: per configuration the fewest replicas meeting the SLOs at that load —
    checked by simulating that many replicas at the load (they meet the SLOs) and one fewer (they
    do not); devices and margin follow; the answer names the configuration with the fewest devices."""
    text = SERVE_SPEC.replace("price_per_hour = 2.0", "price_per_hour = 2.0\nload = 250.0")
    spec = tmp_path / "load.toml"
    spec.write_text(text)
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    # the answer names the configuration and its replicas (a 'fewest devices' line only where there is no answer)
    assert "replicas for 250 req/s" in out and out.startswith("answer: ") and " replica" in out.splitlines()[0]
    rows = sw.load(tmp_path / "out").to_pylist()
    base = sw.parse_spec(tomllib.loads(text), KINDS).base
    for r in rows:
        assert r["status"] == "ok", r
        n = int(r["replicas_for_load"])
        assert r["devices_for_load"] == n * r["devices"]
        assert r["load_margin"] == pytest.approx(n * r["capacity_qps"] / 250.0 - 1.0)
        seed = sw.derive_seed(3, r["point"], 0)
        config = {**base, "policy": r["policy"], "qps": 250.0}
        assert KINDS["serve"].run({**config, "replicas": n}, seed).summary.tpot.p50 <= 0.008
        if n > 1:
            assert KINDS["serve"].run({**config, "replicas": n - 1}, seed).summary.tpot.p50 > 0.008
    ar, k4 = rows
    assert k4["replicas_for_load"] <= ar["replicas_for_load"]


#: SERVE_SPEC at alpha 0.6 with k = 6 under a mean-E2E objective: the searches reach the loads
#: where drafting turns the verification compute-bound. 20 s of arrivals: the latencies are measured
#: at the steady state (warm-up and drain cut), and 10 s leave too few requests near k = 6's
#: capacity for the curve between the doubling grid's 64 req/s and the bisection's 90 req/s.
CROSS_SPEC = (SERVE_SPEC.replace("alpha = 0.8", "alpha = 0.6").replace("duration = 4.0", "duration = 20.0")
              .replace('policy = ["ar", "fixed:k=4"]', 'policy = ["ar", "fixed:k=6"]')
              .replace("slo = { tpot_p50 = 0.008 }", "slo = { e2e_mean = 2.0 }"))


def test_crossover_from_the_searches_own_rates(tmp_path, capsys):
    """The crossover of a speculative configuration against its group's non-speculative one,
    from the latencies both searches already simulated (the curve holds exactly those: the
    capacity's row equals its curve's point), lies where direct simulations of the two put it:
    speculation faster 12% below it, slower 12% above (k = 6 at alpha 0.6 turns the verification
    compute-bound as the batch grows)."""
    spec = tmp_path / "cross.toml"
    spec.write_text(CROSS_SPEC)
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out"), "--workers", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ar, k6 = doc["configurations"]
    assert ar["crossover_qps"] is None and ar["crossover"] is None  # the baseline itself
    curve = dict(map(tuple, k6["latency_curve"]))
    assert curve[k6["capacity_qps"]] == k6["e2e_mean_at_capacity"] and len(curve) == k6["evaluations"]
    cross = k6["crossover_qps"]
    assert cross is not None and 8.0 < cross < k6["capacity_qps"]
    base = sw.parse_spec(tomllib.loads(CROSS_SPEC), KINDS).base

    def speedup(q):
        e2e = [KINDS["serve"].run({**base, "policy": p, "qps": q}, sw.derive_seed(3, i, 0)).summary.e2e.mean
               for i, p in enumerate(("ar", "fixed:k=6"))]
        return e2e[0] / e2e[1]

    assert speedup(cross * 0.88) > 1 > speedup(cross * 1.12)


def test_curve_crossover_edges():
    """Pays over the whole overlap: None; never pays: nan; no overlap: None; exact on lines."""
    pays = cap.curve_crossover([[1, 2.0], [10, 3.0]], [[1, 1.0], [10, 2.0]])
    assert pays == (None, 1.0, 10.0)
    never = cap.curve_crossover([[1, 1.0], [10, 2.0]], [[1, 2.0], [10, 3.0]])
    assert math.isnan(never[0])
    assert cap.curve_crossover([[1, 1.0], [2, 1.0]], [[3, 1.0], [4, 1.0]]) is None
    # log-log straight lines crossing at q = 4: baseline 1·q^0, speculation 0.5·q^0.5
    got = cap.curve_crossover([[1, 1.0], [16, 1.0]], [[1, 0.5], [16, 2.0]])
    assert got[0] == pytest.approx(4.0, rel=1e-9)


def test_each_search_tells_its_steps_on_stderr_and_json_stays_pure(tmp_path, capsys):
    """Progress within each configuration: one stderr line per rate simulated (bracketing,
    bisecting, the 95% interval's ends), each naming the configuration, the rate, its verdict and
    the bracket it leaves; the last bisection's bracket is the row's; then the configuration's
    answer and the count of configurations searched. --json's stdout is the JSON alone."""
    spec = tmp_path / "cap.toml"
    spec.write_text(DES_SPEC)
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out"), "--workers", "1", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    lines = captured.err.splitlines()
    for i, row in enumerate(doc["configurations"]):
        own = [line for line in lines if line.startswith(f"[{i + 1}/2] policy={row['policy']}: ")]
        steps = [line for line in own if any(f": {phase}: rate " in line for phase in ("bracketing", "bisecting", "95% interval"))]
        assert len(steps) == row["evaluations"], own
        assert all(("meets the SLOs" in s or "misses the SLOs" in s) and "latency_mean " in s and "/400" in s for s in steps), steps
        last = [s for s in steps if ": bisecting: " in s][-1]
        assert f"capacity in [{row['bracket_low']:.4g}, {row['bracket_high']:.4g}]" in last or ": 95% interval: " in steps[-1]
        assert own[-1].split(": ", 1)[1].startswith(f"done: capacity {row['capacity_qps']:.4g} req/s, 95% ")
    assert "capacity: 2 of 2 configuration(s) searched" in captured.err


def test_replica_and_lengthening_steps_are_told(tmp_path, capsys):
    """With a load, each replica count simulated is a line (its bracket (fails, meets]); every
    note the row keeps (a run lengthened, a rate overloaded) was said as it happened."""
    text = SERVE_SPEC.replace("price_per_hour = 2.0", "price_per_hour = 2.0\nload = 250.0")
    spec = tmp_path / "load.toml"
    spec.write_text(text)
    assert main(["capacity", str(spec), "--out", str(tmp_path / "out"), "--workers", "1", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    notes = []
    for i, r in enumerate(sw.load(tmp_path / "out").to_pylist()):
        own = [line for line in captured.err.splitlines() if line.startswith(f"[{i + 1}/2] {SERVE_NAMES[r['policy']]}: ")]
        counts = [line for line in own if ": replicas: " in line]
        assert counts and f"fewest in ({r['replicas_for_load'] - 1:g}, {r['replicas_for_load']:g}]" in counts[-1], counts
        notes += json.loads(r["notes"])
        for note in json.loads(r["notes"]):
            assert any(note in line for line in own), note
    assert any("rerun at" in n for n in notes), notes  # 4 s runs: some were lengthened
