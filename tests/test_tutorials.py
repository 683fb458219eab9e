"""Every tutorial runs top to bottom as a plain script (each of its claims is an assert, each exercise runs with
the reference answer), writes its pictures, leaves no shared memory behind, and opens as a notebook with the fixed
sections. Two mutated copies prove that a false claim or a wrong exercise answer fails the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import pytest
from conftest import ROOT

from rlinf_mini.scheduler.shm import PREFIX, SHM_DIR

TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))
PICTURES = {  # tutorial -> the files it must draw into its output folder
    "01_placement": ["01_placement.png"],
    "03_rollout_pipeline": ["03_timeline_stage1.png", "03_timeline_stage2.png"],
    "06_full_run": ["runs/06_straight/learning_curve.png", "runs/06_straight/timeline.png"],
    "07_reasoning": ["runs/07_reasoning/learning_curve.png"],
}
SECTIONS = ["What this stage does", "The code to read", "Run it", "What you should see", "The RLinf counterpart",
            "Exercise"]
TIMEOUT_S = 300  # a hang guard, not a speed check (tutorials aim at <= 60 s on 2 cores; see the report printed)


def run_tutorial(path: Path, out: Path) -> tuple[subprocess.CompletedProcess, float]:
    """`python path` from the repository root, as a learner runs it, with its output folder at `out`."""
    env = dict(os.environ, RLINF_MINI_TUTORIAL_OUT=str(out), MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tutorials"), str(ROOT)]))  # also for copies outside tutorials/
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(path)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    seconds = time.monotonic() - start
    leaked = [n for n in os.listdir(SHM_DIR) if n.startswith(f"{PREFIX}{proc.pid}")]
    for name in leaked:  # clean up, then fail below
        os.unlink(SHM_DIR / name)
    assert not leaked, f"{path.name} left shared memory behind: {leaked}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, output), seconds


def test_every_tutorial_exists():
    names = {p.stem for p in TUTORIALS}
    assert {"00_overview", "01_placement", "02_weight_sync", "03_rollout_pipeline", "04_advantages", "05_training",
            "06_full_run", "07_reasoning"} <= names


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_top_to_bottom(path, tmp_path):
    out = tmp_path / "out"
    result, seconds = run_tutorial(path, out)
    print(f"{path.name}: {seconds:.1f} s")
    assert result.returncode == 0, f"{path.name} failed after {seconds:.1f} s:\n{result.stdout[-4000:]}"
    assert "exercise " in result.stdout and "matches the reference" in result.stdout
    for picture in PICTURES.get(path.stem, []):
        data = (out / picture).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, picture
    shutil.rmtree(out)


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_opens_as_a_notebook_with_the_fixed_sections(path):
    notebook = jupytext.read(path)
    markdown = [c.source for c in notebook.cells if c.cell_type == "markdown"]
    code = [c.source for c in notebook.cells if c.cell_type == "code"]
    assert len(markdown) >= 5 and len(code) >= 4
    assert markdown[0].startswith(f"# {path.stem[:2]} — ")
    text = "\n".join(markdown)
    for section in SECTIONS:
        assert f"## {section}" in text, section
    exercise_cells = [c for c in code if "# EXERCISE" in c]
    assert len(exercise_cells) == 1 and "check_exercise(" in exercise_cells[0]
    assert sum("assert " in c for c in code) >= 3  # the claims are checked


def test_the_overview_lists_every_tutorial_and_stage_file():
    text = (ROOT / "tutorials/00_overview.py").read_text()
    for name in ["00_overview", "01_placement", "02_weight_sync", "03_rollout_pipeline", "04_advantages",
                 "05_training", "06_full_run"]:
        assert name in text, name
    for stage in ["placement", "sync", "rollout", "advantages", "train"]:
        assert f"`stages/{stage}.py` →" in text, stage


MUTATIONS = {  # a false claim, and a wrong exercise answer: each must fail the run
    "false-claim": ("adv_1, ret_1 = compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda=1.0)",
                    "adv_1, ret_1 = compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda=0.9)",
                    "assert torch.allclose(adv_1, G - values[:T]"),
    "wrong-exercise": ("    return compute_gae_advantages_and_returns(rewards, values, dones, gamma, gae_lambda)\n\n\n"
                       "def case(",
                       "    return compute_gae_advantages_and_returns(rewards, values, dones * 0, gamma, "
                       "gae_lambda)\n\n\ndef case(",
                       "exercise my_gae: case 0 differs from the reference"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_false_claim_or_a_wrong_answer_fails_the_tutorial(mutation, tmp_path):
    old, new, message = MUTATIONS[mutation]
    text = (ROOT / "tutorials/04_advantages.py").read_text()
    assert text.count(old) == 1
    copy = tmp_path / "04_mutated.py"
    copy.write_text(text.replace(old, new))
    result, _ = run_tutorial(copy, tmp_path / "out")
    assert result.returncode != 0 and "AssertionError" in result.stdout and message in result.stdout
