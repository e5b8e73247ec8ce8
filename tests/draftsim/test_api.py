"""The typed library API under the CLI (draftsim.config, the commands' configs → functions →
results, draftsim.sweepkinds): callable from Python without argparse, the same checks as the
command line, parsers generated from the configs, every sweep metric resolving on a real run."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

import pytest

from draftsim.analysis.sweep import Kind, resolve_path
from draftsim.api import (
    CheckServeConfig,
    CostConfig,
    DemoConfig,
    EwifConfig,
    KMatrixConfig,
    PlanConfig,
    ReplayConfig,
    ReplayResult,
    ServeConfig,
    ServeSimConfig,
    SimulateConfig,
    SimulateResult,
    ThresholdConfig,
    TreeConfig,
    cost,
    ewif,
    optimize_kmatrix,
    optimize_threshold,
    optimize_tree,
    plan,
    replay,
    serve,
    serve_sim,
    simulate,
)
from draftsim.config import add_options, check, flag_of, from_mapping, from_namespace, options
from draftsim.sim.errors import DraftsimError
from draftsim.sim.traces import EMBEDDED_TRACE
from draftsim.sweepkinds import COMMANDS, KINDS, run_point

SERVE = dict(target="qwen2.5-7b", drafter_model=["qwen2.5-0.5b"], hardware="h100-sxm", alpha=0.8, requests=40, qps=8.0,
             prompt_len="fixed:128", output_len="fixed:32", replications=2)


# --- configs → functions → results, from Python ---------------------------------------------------


def test_simulate_from_python_matches_the_command_line(capsys):
    from draftsim.cli import main

    result = simulate(SimulateConfig(policy="fixed:k=4", alpha=0.8, cost=[0.05], tokens=20_000, seed=3))
    assert isinstance(result, SimulateResult)
    assert result.metrics.ewif.value == result.run.metrics["ewif"].value > 1
    assert result.metrics.time_per_token is None and result.requests is None  # Monte Carlo: no timeline
    assert main(["simulate", "--policy", "fixed:k=4", "--alpha", "0.8", "--cost", "0.05", "--tokens", "20000", "--seed", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(result.to_dict()))


def test_configs_take_domain_objects_as_well_as_specs():
    """The typed API past the boundary: a Policy, Rule or Controller object stands where the
    CLI's spec string does, and gives the same run (ServeSimConfig(policy=FixedK(4)) once failed
    with "empty policy spec")."""
    from draftsim.sim.controllers import parse_controller
    from draftsim.sim.policies import FixedK, parse_policy
    from draftsim.sim.rules import parse_rule

    by_text = simulate(SimulateConfig(policy="fixed:k=4", alpha=0.8, cost=[0.05], tokens=20_000, seed=3))
    by_object = simulate(SimulateConfig(policy=FixedK(4), alpha=0.8, cost=[0.05], tokens=20_000, seed=3))
    assert by_object.metrics.ewif.value == by_text.metrics.ewif.value
    served = serve_sim(ServeSimConfig(**{**SERVE, "policy": parse_policy(SERVE.get("policy", "fixed:k=4"))}))
    assert served.summary.throughput == serve_sim(ServeSimConfig(**SERVE)).summary.throughput
    for parse, spec in ((parse_policy, "threshold:h=0.3,kmax=6"), (parse_rule, "opt:alpha=0.5"), (parse_controller, "disable:above=32")):
        built = parse(spec)
        assert parse(built) is built
    with pytest.raises(DraftsimError, match="empty policy spec"):
        parse_policy(parse_rule("sd"))  # an object of another family is not a policy


def test_every_command_config_runs_from_python():
    assert serve_sim(ServeSimConfig(**SERVE)).summary.throughput > 0
    assert optimize_kmatrix(KMatrixConfig(alpha=0.8, cost=[0.2, 0.0], k_max=4)).exact.ewif >= optimize_kmatrix(
        KMatrixConfig(alpha=0.8, cost=[0.2, 0.0], k_max=4)).grid.ewif
    th = optimize_threshold(ThresholdConfig(alpha=0.8, k_max=8, sweep="0.05,0.05,1"))
    assert th.comparison.oracle <= th.comparison.optimal <= th.comparison.best_fixed_k.latency_per_token
    tree = optimize_tree(TreeConfig(rank_alphas="0.7,0.2", budget=16))
    assert tree.tree.tokens_per_time >= tree.best_chain.tokens_per_time
    rp = replay(ReplayConfig(trace=str(EMBEDDED_TRACE), policy="fixed:k=3"))
    assert isinstance(rp, ReplayResult) and 0 < rp.metrics.ewif.value < rp.oracle.speedup
    priced = cost(CostConfig(target="llama-2-7b", drafter_model=["smollm2-135m"], hardware="h100", batch=[1, 8]))
    assert [r.batch for r in priced.records] == [1, 8, 1, 8] and all(r.c > 0 for r in priced.records)
    table = ewif(EwifConfig(alpha=0.8, cost=0.05))
    assert table.best.k == max(table.rows, key=lambda r: r.ewif).k
    ranked = plan(PlanConfig(drafter=["small:0.8:0.05", "tiny:0.6:0.01"]))
    assert ranked.strategies[0].ewif == max(s.ewif for s in ranked.strategies)


def test_hardware_assembly_from_python():
    """Target + drafters on hardware X from Python (sim.cost.assembly), as the planners use it."""
    from draftsim.sim.cost import Deployment, RooflineModel, assemble

    built = assemble(Deployment("llama-2-7b", "h100", ("smollm2-135m", "maxgram"), tp=2))
    assert isinstance(built.target, RooflineModel) and len(built.drafters) == 2
    t0, cs = built.coefficients(batch=1, context=512)
    assert t0 > 0 and 0 < cs[0] < 1 and cs[1] == 0.0
    assert built.info["backends"]["maxgram"].startswith("free")
    with pytest.raises(DraftsimError, match="give --target MODEL and --hardware HW"):
        assemble(Deployment("", "h100"))
    priced = ewif(EwifConfig(alpha=0.8, target="llama-2-7b", drafter_model=["smollm2-135m"], hardware="h100"))
    assert priced.cost == pytest.approx(assemble(Deployment("llama-2-7b", "h100", ("smollm2-135m",))).coefficients()[1][0])


@pytest.mark.parametrize("config,message", [
    (lambda: SimulateConfig(policy="fixed:k=4", alpha=1.5, cost=[0.05]), r"alpha must lie in \[0, 1\]; got 1.5"),
    (lambda: SimulateConfig(policy="fixed:k=4", alpha=0.8, cost=[0.05], executor="gpu"), "--executor must be one of mc, des"),
    (lambda: SimulateConfig(policy="fixed:k=4", alpha=0.8, cost=0.05), "--cost takes a list of values"),
    (lambda: ServeSimConfig(**{**SERVE, "replicas": 0}), r"replicas must be an integer in \[1, 1024\]; got 0"),
    (lambda: SimulateConfig(policy=None, alpha=0.8), "--policy is required"),
])
def test_python_configs_get_the_command_lines_checks(config, message):
    with pytest.raises(DraftsimError, match=message):
        check(config())
    with pytest.raises(DraftsimError, match=message):
        simulate(config()) if isinstance(config(), SimulateConfig) else serve_sim(config())


def test_parsers_are_generated_from_the_configs():
    parser = argparse.ArgumentParser()
    add_options(parser, SimulateConfig)
    ns = parser.parse_args(["--policy", "fixed:k=2", "--alpha", "0.7", "--cost", "0.1", "--cost", "0.2", "--separate-drafter"])
    config = from_namespace(SimulateConfig, ns)
    assert config == SimulateConfig(policy="fixed:k=2", alpha=0.7, cost=[0.1, 0.2], separate_drafter=True)
    assert from_mapping(SimulateConfig, {"policy": "fixed:k=2", "alpha": 0.7, "cost": [0.1, 0.2], "separate-drafter": True},
                        "simulate") == config
    # one vocabulary: the deprecated spellings still read as the canonical option
    assert from_mapping(ServeSimConfig, {"drafter": ["x"]}, "serve-sim").drafter_model == ["x"]
    assert from_mapping(ReplayConfig, {"trace": "t", "policy": "p", "drafter": ["a"]}, "replay").trace_drafter == ["a"]
    with pytest.raises(DraftsimError, match=r"--drafter-model is set twice \(--drafter: its old spelling\)"):
        from_mapping(ServeSimConfig, {"drafter_model": ["x"], "drafter": ["y"]}, "serve-sim")
    with pytest.raises(DraftsimError, match="draftsim simulate has no option --alpah"):
        from_mapping(SimulateConfig, {"alpah": 0.5}, "simulate")
    with pytest.raises(DraftsimError, match=r"argument --alpha: alpha must lie in \[0, 1\]"):
        from_mapping(SimulateConfig, {"alpha": 2}, "simulate")


@pytest.mark.parametrize("command,config", [("serve", ServeConfig), ("check-serve", CheckServeConfig), ("demo", DemoConfig)])
def test_real_model_commands_parse_from_their_configs(command, config, capsys):
    """serve, check-serve and demo: each option of the config is on the command's --help, and
    the parsed command line is the config (defaults included)."""
    from draftsim.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    for name, (_, opt) in options(config).items():
        assert (name if opt.positional else flag_of(name)) in shown, name
    args = ["some/trace"] if command == "check-serve" else []
    assert from_namespace(config, build_parser().parse_args([command, *args])) == config(**({"trace": args[0]} if args else {}))


def test_real_model_configs_are_checked_before_any_model_loads(tmp_path):
    from draftsim.api import check_serve, demo

    assert from_mapping(ServeConfig, {"model": "some/folder"}, "serve").target == "some/folder"  # --model: the old spelling of --target
    for config, message in [
        (ServeConfig(qps=10.0, requests=2, max_batch=0), r"max_batch must be an integer in \[1, 4096\]; got 0"),
        (ServeConfig(qps=-1.0, requests=2), "qps must be finite and > 0; got -1"),
        (ServeConfig(qps=10.0, requests=2, scheduling="lifo"), "--scheduling must be one of fcfs"),
        (ServeConfig(qps=10.0, requests=2, dtype="int4"), "--dtype must be one of float32, bfloat16, float16"),
    ]:
        with pytest.raises(DraftsimError, match=message):
            check(config)
        with pytest.raises(DraftsimError, match=message):
            serve(config)
    with pytest.raises(DraftsimError, match="give --qps"):
        serve(ServeConfig(requests=2))  # the workload is checked before SmolLM2 loads
    with pytest.raises(DraftsimError, match=r"give a serving TRACE folder or --vllm-result FILE \(one of them\)"):
        check_serve(CheckServeConfig())
    with pytest.raises(DraftsimError, match="no trace at"):
        check_serve(CheckServeConfig(trace=str(tmp_path / "nothing")))
    with pytest.raises(DraftsimError, match="--out needs a folder path; got ''"):
        demo(DemoConfig(out=""))
    with pytest.raises(DraftsimError, match="is a flag"):
        demo(DemoConfig(out=str(tmp_path), no_real="yes"))


def test_serve_and_check_serve_from_python(tmp_path):
    """A tiny model served from Python, its trace checked from Python: the replay serves the
    same requests and tokens."""
    from draftsim.api import check_serve

    pytest.importorskip("transformers")
    trace = tmp_path / "trace"
    served = serve(ServeConfig(target="tiny:1", qps=50.0, requests=4, output_len="fixed:6", max_batch=2, trace=str(trace)))
    assert served.metrics.requests == 4 and served.metrics.output_tokens == 24 and served.trace == str(trace)
    assert served.metrics.spec_decode.num_drafts > 0 and served.metrics.ttft.p50 > 0
    assert served.to_dict()["requests"] == 4 and served.to_dict()["spec_decode"]["num_drafts"] == served.metrics.spec_decode.num_drafts
    out = check_serve(CheckServeConfig(trace=str(trace)))
    assert out.data["predicted"]["output_tokens"] == out.data["measured"]["output_tokens"] == 24
    assert out.target == served.target and {r.metric for r in out.metrics} >= {"throughput"}
    assert [r.relative_error for r in out.metrics] == [r["relative_error"] for r in out.to_dict()["metrics"]]


# --- sweep kinds: metrics checked at registration, every one resolving on a real run ---------------


def test_an_unknown_metric_is_refused_when_a_kind_is_made():
    with pytest.raises(DraftsimError, match="metric 'time_per_token' does not resolve"):
        Kind("replay", print, print, {"time_per_token": "metrics.time_per_token.value"}, (), results=(ReplayResult,))
    with pytest.raises(DraftsimError, match="'metrics.ewif' is not a number"):
        resolve_path((SimulateResult,), "metrics.ewif")
    assert resolve_path((SimulateResult,), "requests.latency_p99") is float
    with pytest.raises(DraftsimError, match="default metric 'speed'"):
        Kind("x", print, print, {"ewif": "ewif"}, ("speed",))


#: A small point per kind (and per optimize subcommand) on which every metric exists.
POINTS = {
    "simulate": [dict(policy="fixed:k=4", alpha=0.8, cost=[0.05], tokens=4000, executor="des", requests=4, rate=0.5)],
    "serve": [SERVE],
    "optimize": [dict(what="kmatrix", alpha=0.8, cost=[0.2, 0.0], k_max=3),
                 dict(what="threshold", alpha=0.8, k_max=8, sweep="0.05,0.05,1"),
                 dict(what="tree", rank_alphas="0.7,0.2", budget=8)],
    "replay": [dict(trace=str(EMBEDDED_TRACE), policy="fixed:k=3")],
}


@pytest.mark.parametrize("name", list(KINDS))
def test_every_metric_of_every_kind_resolves_to_a_number(name):
    kind = KINDS[name]
    found: dict[str, float] = {}
    for i, point in enumerate(POINTS[name]):
        kind.validate(point)
        result = run_point(name, point, 7 + i if kind.seed_option else None)
        assert isinstance(result, COMMANDS[name].results)
        for metric, path in kind.metrics.items():
            from draftsim.analysis.sweep import lookup

            value = lookup(result, path)
            if value is not None:
                assert isinstance(value, (int, float)), (metric, value)
                found[metric] = float(value)
    assert sorted(found) == sorted(kind.metrics)
    assert all(math.isfinite(v) for m, v in found.items() if not m.endswith("ci95")), found


def test_no_import_circle():
    """The sweep kinds need no command line: importing them leaves draftsim.cli unimported."""
    code = "import sys, draftsim.sweepkinds; assert 'draftsim.cli' not in sys.modules, 'circle'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_sweep_and_plot_from_python(tmp_path):
    from draftsim.api import SweepConfig, SweepPlotConfig, sweep, sweep_plot

    spec = tmp_path / "spec.toml"
    spec.write_text('version = 1\nkind = "simulate"\nmetrics = ["ewif"]\n[base]\npolicy = "fixed:k=3"\ncost = [0.05]\ntokens = 2000\n'
                    '[grid]\nalpha = [0.6, 0.9]\n')
    checked = sweep(SweepConfig(spec=str(spec), out=str(tmp_path / "out"), check=True))
    assert checked.summary is None and checked.to_dict()["tasks"] == 2 and not (tmp_path / "out").exists()
    done = sweep(SweepConfig(spec=str(spec), out=str(tmp_path / "out"), workers=1))
    assert (done.summary.ran, done.summary.failed) == (2, 0)
    plot = sweep_plot(SweepPlotConfig(folder=str(tmp_path / "out"), x="alpha", metric="ewif", out=str(tmp_path / "ewif.png")))
    (low,), (high,) = sorted(plot.groups)
    assert plot.groups[(low,)][0] < plot.groups[(high,)][0] and (tmp_path / "ewif.png").is_file()


def test_run_profile_and_train_head_return_typed_results(tmp_path):
    """The real-model commands from Python, on tiny models: typed results whose to_dict is the
    JSON their command prints, and whose typed fields agree with it."""
    from draftsim.api import ProfileConfig, RunConfig, TrainHeadConfig, profile, run_method, train_head

    pytest.importorskip("transformers")
    ran = run_method(RunConfig(target="tiny:1", method="sd", drafter="tiny:1", policy="fixed:k=3", prompts="arithmetic", n=2,
                               max_new_tokens=8))
    m, data = ran.measurement, ran.to_dict()
    assert m.prompts == data["prompts"] == 2 and m.speedup == data["speedup"] and m.target == data["target"]
    assert m.mean_accepted_length > 1.5 and data["sim_check"]["counts_equal"]  # the drafter is the target: every draft accepted
    out = tmp_path / "p.json"
    prof = profile(ProfileConfig(model="tiny:1", out=str(out), batch=[1], new_tokens=[1, 2], context=[8], repeats=1, warmup=0,
                                 drafters="ngram"))
    assert prof.profile.seconds.shape == (1, 2, 1) and out.is_file() and prof.file == str(out)
    assert [p["seconds"] for p in prof.to_dict()["points"]] == prof.profile.seconds.ravel().tolist()
    assert set(prof.profile.drafters) == {"ngram"} and prof.comparison is None
    head = train_head(TrainHeadConfig(target="tiny:1", drafter="tiny:2", out=str(tmp_path / "head"), epochs=2, prompts_per_set=2,
                                      max_new_tokens=8, device="cpu"))
    assert (tmp_path / "head" / "head.json").is_file() and head.path == str(tmp_path / "head")
    assert head.train_examples > 0 and head.to_dict()["binary_kl"] == head.binary_kl and "drafter" not in head.to_dict()
