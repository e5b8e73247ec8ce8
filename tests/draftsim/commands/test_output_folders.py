"""profile and demo check every input before they create or write anything: a refused run leaves
the disk as it found it. demo creates its --out folder (nested too), and only after the checks;
profile refuses an --out or --probe in a folder that does not exist."""

from __future__ import annotations

import pytest
from clirun import run


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("argv", [
    ["--out", "{T}/missing/x.json"],  # a folder that does not exist: refused, not created
    ["--out", "{T}/x.json", "--probe", "{T}/missing/hw.json"],
    ["--out", "{T}/x.json", "--drafters", "nope"],
    ["--out", "{T}/x.json", "--path", "server-prefill", "--batch", "2"],
    ["--out", "{T}/x.json", "--probe", "{T}/x.json"],
])
def test_a_refused_profile_writes_nothing(tmp_path, capsys, argv):
    (tmp_path / "keep").mkdir()
    status, out, err = run(capsys, "profile", "--model", "tiny", *[a.replace("{T}", str(tmp_path)) for a in argv])
    assert status == 2 and err.count("\n") == 1, err
    assert _tree(tmp_path) == ["keep"]


def test_a_refused_demo_creates_nothing(tmp_path, capsys):
    (tmp_path / "afile.txt").write_text("x")
    status, out, err = run(capsys, "demo", "--out", str(tmp_path / "afile.txt" / "sub" / "deeper"), "--no-real")
    assert status == 2 and "is a file, not a folder" in err
    assert _tree(tmp_path) == ["afile.txt"]


def test_demo_creates_a_nested_out_folder_only_after_its_checks(tmp_path, monkeypatch):
    from draftsim.commands import demo as command

    out = tmp_path / "new" / "nested"
    seen = []

    def fake_run_demo(folder, **kw):  # the work starts: nothing was created by the checks before it
        seen.append(tmp_path.exists() and _tree(tmp_path))
        folder.mkdir(parents=True)
        return {"settings": [], "simulations": [], "optimisation": {}, "replay": {}, "serving": {}, "real": {}, "figures": []}

    monkeypatch.setattr(command, "run_demo", fake_run_demo)
    command.demo(command.DemoConfig(out=str(out), no_real=True))
    assert seen == [[]] and out.is_dir()
