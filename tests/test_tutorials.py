"""Every tutorial runs top to bottom as a plain script (each of its claims is an assert, each exercise runs with
the reference answer), in the user's checkout after their runs of every shipped config (conftest.users_checkout),
which it leaves as it was; it writes its pictures, leaves no shared memory behind, is listed in README's Learning path
table (its time is printed beside the table's, never asserted: load stretches any wall time), and opens as a
notebook with the fixed sections and a link to the glossary. Two mutated copies prove that a false claim or a wrong
exercise answer fails the run; a plausible wrong answer to each exercise of 00-03 fails with a message that names
the case and the first place that differs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import pytest
from conftest import ROOT, tree_snapshot

from rlinf_mini.scheduler.shm import PREFIX, SHM_DIR

TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))
PICTURES = {  # tutorial -> the files it must draw into its output folder
    "01_placement": ["01_placement.png"],
    "03_rollout_pipeline": ["03_timeline_stage1.png", "03_timeline_stage2.png", "runs/03_step/timeline.png"],
    "06_full_run": ["runs/06_straight/learning_curve.png", "runs/06_straight/timeline.png"],
    "07_reasoning": ["runs/07_reasoning/learning_curve.png"],
}
SECTIONS = ["What this stage does", "The code to read", "Run it", "What you should see", "The RLinf counterpart",
            "Exercise"]
TIMEOUT_S = 300  # a hang guard, not a speed check


def stated_seconds() -> dict[str, float]:
    """README's Learning path table: tutorial -> its stated time on a 2-core CPU ("about N s")."""
    section = (ROOT / "README.md").read_text().split("## Learning path", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\d\d_\w+)\.py` \|.*\| about (\d+) s \|$", section, re.M)
    return {name: float(seconds) for name, seconds in rows}


def run_tutorial(path: Path, out: Path, cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess, float]:
    """`python path` from `cwd` (the repository, or a stand-in of the user's), as a learner runs it, with its output
    folder at `out`."""
    env = dict(os.environ, RLINF_MINI_TUTORIAL_OUT=str(out), MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tutorials"), str(ROOT)]))  # also for copies outside tutorials/
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(path)], cwd=cwd, env=env, text=True,
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


def test_readme_states_the_time_of_every_tutorial_and_each_tutorial_says_the_same():
    stated = stated_seconds()
    assert sorted(stated) == [p.stem for p in TUTORIALS]
    for path in TUTORIALS:  # a tutorial's "Run it" line may state its time too: then the same figure
        said = re.search(r"\(about (\d+) s on a 2-core CPU", jupytext.read(path).cells[0].source)
        assert said is None or float(said.group(1)) == stated[path.stem], path.name


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_top_to_bottom(path, tmp_path, users_checkout):
    out = tmp_path / "out"
    before = tree_snapshot(users_checkout)
    result, seconds = run_tutorial(path, out, cwd=users_checkout)  # a learner's, who ran every shipped config before
    stated = stated_seconds()[path.stem]
    print(f"{path.name}: {seconds:.1f} s (README: about {stated:g} s; load average {os.getloadavg()[0]:.1f})")
    assert result.returncode == 0, f"{path.name} failed after {seconds:.1f} s:\n{result.stdout[-4000:]}"
    assert "exercise " in result.stdout and "matches the reference" in result.stdout
    assert tree_snapshot(users_checkout) == before, f"{path.name} wrote into the user's results/"
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
    for path in TUTORIALS:
        assert path.stem in text, path.stem
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
                       "exercise my_gae: an episode ends mid-rollout differs from the reference"),
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


def glossary_terms() -> list[str]:
    return re.findall(r"^- \*\*(.+?)\*\*:", (ROOT / "tutorials/glossary.md").read_text(), re.M)


def test_every_glossary_term_is_used_in_a_tutorial_and_every_tutorial_links_the_glossary():
    def words(text: str) -> str:  # "micro-batch", "micro batch" and "Micro\n# batch" are the same words
        return " " + re.sub(r"[\s#-]+", " ", text.lower()) + " "

    terms = glossary_terms()
    assert len(terms) >= 40 and len(set(terms)) == len(terms)
    for term in ["chunk step", "env step", "rollout_epoch", "update_epoch", "max_epochs", "global batch", "micro batch",
                 "stage", "placement", "version", "staleness", "bootstrap", "truncation"]:
        assert term in terms, term
    tutorials = words(" ".join(p.read_text() for p in TUTORIALS))
    unused = [t for t in terms if not re.search(rf"\W{re.escape(words(t).strip())}s?\W", tutorials)]  # or plural
    assert not unused, f"glossary terms no tutorial uses: {unused}"
    for path in TUTORIALS:
        assert "(glossary.md)" in jupytext.read(path).cells[0].source, f"{path.name} does not link the glossary"


# A plausible wrong answer to each exercise (the line that replaces the shipped body), and what the failure must
# name: the case and the first place that differs (an index, or the value where the answer is one number).
WRONG_ANSWERS = {
    "00_overview": ("    return total_num_envs * max_steps_per_rollout_epoch  # forgets rollout_epoch",
                    "exercise my_env_steps: 2 rollout epochs differs from the reference: the result = 128, "
                    "expected 256", "inputs: 16, 8, 2"),
    "01_placement": ("    return [d[:1] for d in reference_devices(value, num_devices)]  # one device per process",
                     "exercise devices_of_ranks: two devices per process differs from the reference: the result[0] "
                     "has 1 items, expected 2", "inputs: '0-3:0-1', 4"),
    "02_weight_sync": ("    return [64 + sum(t.numel() * t.element_size() for t in list(state.values())[:i])"
                       " for i in range(len(state))]  # forgets the 64-byte alignment",
                       "exercise my_offsets: the MLP policy differs from the reference: the result[1] = 72, "
                       "expected 128",
                       "inputs: {actor_logstd: float32[2], backbone.0.weight: float32[64, 4]"),
    "03_rollout_pipeline": ("    n = total_num_envs // world_size // stage_num; "
                            "return [list(range((k * world_size + rank) * n, (k * world_size + rank + 1) * n))"
                            " for k in range(stage_num)]  # stage-major",
                            "exercise my_stage_env_ids: rank 1 of 2, 2 stages differs from the reference: "
                            "the result[0][0] = 4, expected 8", "inputs: 1, 2, 2, 16"),
    "04_advantages": ("    return compute_gae_advantages_and_returns(rewards, values, dones * 0, gamma, gae_lambda)",
                      "exercise my_gae: an episode ends mid-rollout differs from the reference: the result[0][0, 0]",
                      "inputs: float32[8, 4]("),
    "05_training": ("    return reference_ppo_loss(logprobs, old_logprobs, advantages, clip_low, clip_low, clip_c)"
                    "  # symmetric clip",
                    "exercise my_ppo_loss: asymmetric clip (low 0.2, high 0.28), no dual clip reached differs from "
                    "the reference: the result", "0.2, 0.28, 10.0"),
    "06_full_run": ("    folders = sorted((run_dir / 'checkpoints').glob('global_step_*')); "
                    "return folders[-1] if folders else None  # compares names as text",
                    "exercise my_latest: steps with different numbers of digits differs from the reference: the "
                    "result = PosixPath(", "inputs: PosixPath("),
    "07_reasoning": ("    return compute_grpo_token_advantages(rewards, response_mask, len(rewards))  # one group",
                     "exercise my_grpo_advantages: two groups of 4 differs from the reference: the result[0, 0]",
                     "inputs: float32[8]("),
}


@pytest.mark.parametrize("stem", WRONG_ANSWERS)
def test_a_wrong_exercise_answer_names_the_case_and_the_first_difference(stem, tmp_path, monkeypatch):
    """In process, without running the tutorial: its exercise cell, after the tutorial's imports, with the body
    replaced by a plausible wrong answer."""
    monkeypatch.setenv("RLINF_MINI_TUTORIAL_OUT", str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT / "tutorials"))
    cells = [c.source for c in jupytext.read(ROOT / "tutorials" / f"{stem}.py").cells if c.cell_type == "code"]
    imports = "\n".join(line for c in cells for line in c.splitlines() if line.startswith(("import ", "from ")))
    cell = next(c for c in cells if "# EXERCISE" in c)
    lines = cell.splitlines()
    body = next(i for i, line in enumerate(lines) if "# EXERCISE" in line) + 1
    assert lines[body].strip().startswith("return ")  # the shipped body: the reference call
    wrong, names_the_case, shows_the_inputs = WRONG_ANSWERS[stem]

    def run(source: str, name: str) -> None:
        exec(compile(imports + "\n" + source, name, "exec"), {"__name__": "exercise_cell"})

    run(cell, f"{stem} exercise cell")  # as shipped: passes
    lines[body] = wrong
    with pytest.raises(AssertionError) as failure:
        run("\n".join(lines), f"{stem} exercise cell, wrong answer")
    message = str(failure.value)
    assert names_the_case in message and shows_the_inputs in message, message
