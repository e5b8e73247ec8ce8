"""The demo's serving study names the deployment it ran (the engine, both models' tp, the
scheduler's limits) in its printed text and in its figure's title."""

from __future__ import annotations

from draftsim.analysis import demo, loadstudy
from draftsim.commands.demo import serving_lines


def test_the_serving_study_names_its_engine_and_drafter_tp_in_text_and_figure(tmp_path, monkeypatch):
    titles = []
    real = loadstudy.speedup_vs_load

    def spy(path, rows, title="", cross=None):
        titles.append(title)
        return real(path, rows, title, cross)

    monkeypatch.setattr(loadstudy, "speedup_vs_load", spy)
    sv = demo.serving_study(tmp_path, requests=20, qps=(1, 16))
    assert sv["engine"] == "none" and sv["engine_label"] == "none (the roofline alone)" and sv["tp"] == 4 and sv["drafter_tp"] == 1
    assert "engine none" in titles[0] and "(tp 4)" in titles[0] and "llama-2-7b (tp 1)" in titles[0]
    head = serving_lines(sv)[0]
    assert "llama-2-70b (tp 4) / llama-2-7b (tp 1) on h100-sxm, engine none (the roofline alone)" in head
    assert "max_num_seqs 256" in head and "max_num_batched_tokens 2,048" in head


def test_the_study_runs_the_deployment_it_is_given():
    from draftsim.sim.cost.assembly import Deployment

    sv = demo.serving_study(None, requests=20, qps=(1,), deployment=Deployment("llama-2-70b", "h100-sxm", ("llama-2-7b",), tp=4))
    assert sv["engine"] == "vllm" and sv["drafter_tp"] == 4 and "engine vllm v0.10.1" in serving_lines(sv)[0]
