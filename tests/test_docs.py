"""The docs say what the code does. docs/what_you_should_see.md is benchmarks/healthy_runs.py's render of its JSON,
covers every shipped config, and lists only metrics that a real short run logs. Every message docs/troubleshooting.md
quotes is printed, as quoted, when its cause is made to happen through the real code (fault injection for the
failures of a run). The pseudocode boxes of the README and tutorials 00 and 07 name only what the code defines.

The runs that several entries read (a killed worker, a hang, inline runs that raise) are started once, on first use,
by one module fixture; the config errors are answered by `main` in this process before any worker starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import io
import json
import os
import pkgutil
import re
import sys
import tempfile
import traceback
from pathlib import Path

import jupytext
import pytest
import torch
from conftest import ROOT, write_config
from test_faults import BASE, BROKEN_ENV, DATA_PARALLEL, _merge
from toy_workers import EchoWorker

from benchmarks import healthy_runs
from rlinf_mini.config import ClusterConfig, TrainConfig, load_config
from rlinf_mini.scheduler import devices, faults, shm, worker
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.train import main
from stages.placement import ComponentPlacement
from stages.sync import WeightReceiver

# --------------------------------------------------------------------------------------------------------------------
# What you should see: the healthy-run page


def page_metrics() -> dict[str, list[str]]:
    """docs/what_you_should_see.md: row name (config, or config+variant) -> the metrics its table lists."""
    out: dict[str, list[str]] = {}
    for section in re.split(r"^## `configs/", healthy_runs.PAGE_PATH.read_text(), flags=re.M)[1:]:
        name, rest = section.split(".yaml`", 1)
        variant = re.match(r" \+ (\w+):", rest)
        name += f"+{variant[1]}" if variant else ""
        out[name] = re.findall(r"^\| `([\w/]+)`: ", section, re.M)
    return out


def test_the_page_is_the_render_of_the_shipped_json():
    data = json.loads(healthy_runs.JSON_PATH.read_text())
    assert healthy_runs.render(data) == healthy_runs.PAGE_PATH.read_text(), (
        "docs/what_you_should_see.md is not the render of benchmarks/healthy_runs.json: run "
        "`python -m benchmarks.healthy_runs --render` (or measure again)")


def test_every_shipped_config_has_a_recipe_and_a_row():
    shipped = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert sorted({r.config for r in healthy_runs.RECIPES}) == shipped
    entries = {healthy_runs.entry_key(e): e for e in json.loads(healthy_runs.JSON_PATH.read_text())["recipes"]}
    assert sorted(entries) == sorted(r.key for r in healthy_runs.RECIPES)  # a row per recipe, its variants too
    for name, entry in entries.items():  # a row says what was measured, or why not
        assert entry["status"] == "measured" or entry["status"], name
        if entry["status"] == "measured":
            assert len(entry["runs"]) == next(r.seeds for r in healthy_runs.RECIPES if r.key == name)
            assert page_metrics()[name], name


def test_the_summary_windows_and_quantiles():
    rows = [{"step": 0, "eval/return": 0.5}] + [{"step": s, "time/step": float(s)} for s in range(1, 10)]
    runs = [{"exit_code": 0, "rows": rows}, {"exit_code": 0, "rows": [{**r, "eval/return": 0.7} if "eval/return" in r
                                                                      else r for r in rows]}]
    s = healthy_runs.summarize(healthy_runs.RECIPES[0], runs)
    assert (s["early_steps"], s["late_steps"]) == ([1, 3], [7, 9])
    late = s["metrics"]["time/step"]["late"]
    assert (late["median"], late["p10"], late["p90"], late["n"]) == (8.0, 7.0, 9.0, 6)
    assert s["metrics"]["eval/return"] == {"first_step": 0, "first": [0.5, 0.7], "last_step": 0, "last": [0.5, 0.7]}


# --------------------------------------------------------------------------------------------------------------------
# The runs several checks read


RUNS = {  # name -> (RLINF_MINI_FAULT, config sections merged into test_faults.BASE)
    # actor rank 0 is SIGKILLed in its third run_training(): steps 0-2 are logged first (eval every step, traced)
    "kill9": ("group=ActorGroup,rank=0,method=run_training,call=3,kind=kill9",
              {"runner": {"val_check_interval": 1, "trace": True}}),
    "hang_env": ("group=EnvGroup,method=interact,call=1,kind=hang", {"cluster": {"timeout_s": 8}}),
    # inline: every rank a thread of this process (no worker processes to start); the messages are the local ones
    "raise_inline": ("group=ActorGroup,rank=1,method=compute_advantages_and_returns,call=1,kind=raise",
                     {"cluster": {**DATA_PARALLEL["cluster"], "backend": "inline"}}),
    "nan_inline": ("group=ActorGroup,rank=1,method=run_training,call=1,kind=nan",
                   {"cluster": {**DATA_PARALLEL["cluster"], "backend": "inline"}}),
    # async PPO as the page's +async rows run it (staleness 1, the recomputed anchor, the weight cap), eval every step
    "async_inline": (None, {"cluster": {"backend": "inline"}, "runner": {"val_check_interval": 1, "trace": True},
                            "algorithm": {"loss_type": "decoupled_actor_critic", "staleness_threshold": 1,
                                          "behave_weight_threshold": 2.0},
                            "rollout": {"recompute_logprobs": True}}),
    "broken_env_inline": (None, {"cluster": {"backend": "inline"}, "env": {
        "train": {**BROKEN_ENV, "init_params": {"id": "toy_envs:BrokenStep-v0"}},
        "eval": {**BROKEN_ENV, "init_params": {"id": "toy_envs:BrokenStep-v0"}}}}),
}


def printed_by_main(argv: list[str], fault: str | None = None) -> tuple[int | str, str]:
    """(exit code, what `python -m rlinf_mini.train ARGV` prints on stderr), run as `main` in this process; an
    exception main lets through ends the text as Python prints it, and the code is its name."""
    err = io.StringIO()
    previous = os.environ.pop(faults.ENV_VAR, None)
    if fault:
        os.environ[faults.ENV_VAR] = fault  # the workers inherit it at launch
    try:
        with contextlib.redirect_stderr(err), contextlib.chdir(ROOT):  # relative config paths, as a user types them
            code = main(argv)
    except Exception as e:  # noqa: BLE001 (the page quotes what a user sees then)
        code, _ = type(e).__name__, err.write("".join(traceback.format_exception_only(e)))
    finally:
        os.environ.pop(faults.ENV_VAR, None)
        if previous is not None:
            os.environ[faults.ENV_VAR] = previous
    return code, err.getvalue()


class Runs:
    """The module's real runs, each started once, when a test first asks for it."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.done: dict[str, tuple[int | str, str, Path]] = {}

    def __call__(self, name: str) -> tuple[int | str, str, Path]:
        if name not in self.done:
            tmp = self.tmp_path_factory.mktemp(name)
            fault, sections = RUNS[name]
            code, text = printed_by_main(["--config", str(write_config(tmp, **_merge(BASE, sections)))], fault)
            self.done[name] = (code, text, tmp / "results" / "embodied")
        return self.done[name]

    def text(self, name: str, expect_code: int = 1) -> str:
        code, text, _ = self(name)
        assert code == expect_code, text
        return text


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory)


def logged_keys(metrics: Path) -> set[str]:
    return {k for line in metrics.read_text().splitlines() for k in json.loads(line)}


@pytest.fixture(scope="module")
def reasoning_keys(tmp_path_factory) -> set[str]:
    """The metrics of a two-step reasoning run with a KL penalty (inline; a model warm-started for a few steps only:
    it need not be right, only log)."""
    tmp = tmp_path_factory.mktemp("reasoning")
    path = write_config(tmp, "configs/math.yaml", cluster={"backend": "inline"}, algorithm={"kl_beta": 0.05},
                        runner={"max_epochs": 2, "val_check_interval": 1, "save_interval": -1},
                        data={"arithmetic": {"num_train": 256, "num_val": 16}})
    cfg = load_config(["--config", str(path)])
    from rlinf_mini.models.make_tiny_lm import create_tiny_lm

    create_tiny_lm(cfg, cfg.actor.model.model_path, sft_steps=5)
    code, text = printed_by_main(["--config", str(path)])
    assert code == 0, text
    return logged_keys(tmp / "results" / cfg.runner.logger.experiment_name / "metrics.jsonl")


@pytest.mark.parametrize("task", ["embodied", "reasoning"])
def test_every_metric_on_the_page_is_logged_by_a_real_short_run(task, request):
    listed = {}
    for name, metrics in page_metrics().items():
        if load_config(["--config", str(ROOT / f"configs/{name.split('+')[0]}.yaml")]).runner.task_type == task:
            listed[name] = metrics
    assert listed, f"no {task} config on the page"
    if task == "reasoning":
        keys = async_keys = request.getfixturevalue("reasoning_keys")  # (no reasoning row is async)
    else:  # a synchronous run for the plain rows, an async one for the +async rows
        runs = request.getfixturevalue("runs")
        code, text, folder = runs("async_inline")
        assert code == 0, text
        keys = logged_keys(runs("kill9")[2] / "metrics.jsonl")
        async_keys = logged_keys(folder / "metrics.jsonl")
    for name, metrics in listed.items():
        have = async_keys if name.endswith("+async") else keys
        assert set(metrics) <= have, f"{name}: {sorted(set(metrics) - have)} are not in a real run's metrics.jsonl"


# --------------------------------------------------------------------------------------------------------------------
# Troubleshooting: every quoted message, made to happen


TROUBLESHOOTING = ROOT / "docs/troubleshooting.md"
MLP = "configs/embodied_mlp.yaml"


def page_entries() -> dict[str, str]:
    """docs/troubleshooting.md: entry title (its ### heading) -> the message it quotes (its first code block)."""
    out = {}
    for block in re.split(r"^### ", TROUBLESHOOTING.read_text(), flags=re.M)[1:]:
        title, body = block.split("\n", 1)
        out[title.strip()] = re.search(r"^```\n(.*?)^```", body, re.M | re.S).group(1)
    return out


def assert_quoted(quote: str, printed: str) -> None:
    """Each line of the quote is printed, in order: `<...>` stands for any text of one line, a `...` line for
    lines left out."""
    pos = 0
    for line in quote.splitlines():
        if line == "...":
            continue
        pattern = ".+?".join(re.escape(part) for part in re.split(r"<[^<>]+>", line))
        found = re.compile(pattern).search(printed, pos)
        assert found, f"the page quotes a line that was not printed:\n{line}\n--- printed:\n{printed[-4000:]}"
        pos = found.end()


def config_error(*overrides: str, config: str = MLP, tmp: Path) -> str:
    """What `python -m rlinf_mini.train --config CONFIG OVERRIDES` prints; exit code 2, nothing started."""
    code, text = printed_by_main(["--config", config, f"runner.logger.log_path={tmp}", *overrides])
    assert code == 2 and text.count("\n") == 1, text
    return text


@contextlib.contextmanager
def toy_cluster(**patches):
    """A one-device cluster for toy groups, with module constants of scheduler/worker.py patched (a shorter wait)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in patches.items():
            mp.setattr(worker, name, value)
        cluster = Cluster(ClusterConfig(num_devices=1, timeout_s=0.5))
        try:
            yield cluster
        finally:
            cluster.shutdown()


def group_call_timeout(tmp: Path) -> str:
    with toy_cluster(WAIT_MARGIN_S=0.5) as cluster:
        group = EchoWorker.create_group(None).launch(cluster, ComponentPlacement({"p": "0"}, 1).get_strategy("p"))
        group.info().wait(timeout=60)  # started
        with pytest.raises(TimeoutError) as e:
            group.sleep(30).wait()  # cluster.timeout_s + margin
        group.shutdown(timeout=0.5)
        cluster.groups.remove(group)
    return str(e.value)


def start_timeout(tmp: Path) -> str:
    with toy_cluster(WAIT_MARGIN_S=0.5, START_MIN_S=0.5) as cluster, pytest.MonkeyPatch.context() as mp:
        mp.setenv(faults.ENV_VAR, "method=__init__,kind=hang")  # the rank's constructor never returns
        group = EchoWorker.create_group(None).launch(cluster, ComponentPlacement({"p": "0"}, 1).get_strategy("p"),
                                                     name="Stuck")
        mp.delenv(faults.ENV_VAR)
        with pytest.raises(TimeoutError) as e:
            group.info().wait()
        group.shutdown(timeout=0.5)
        cluster.groups.remove(group)
    return str(e.value)


def weight_sync_timeout(tmp: Path) -> str:
    receiver = WeightReceiver(torch.nn.Linear(2, 2))  # the rollout's side; no actor ever stamps version 1
    try:
        with pytest.raises(TimeoutError) as e:
            receiver.wait_for_version(1, timeout=0.05)
    finally:
        receiver.close()
    return "".join(traceback.format_exception_only(e.value))


def shm_too_small(tmp: Path) -> str:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shm, "free_bytes", lambda folder=shm.SHM_DIR: 1024)  # /dev/shm as a full one reports itself
        code, text = printed_by_main(["--config", str(write_config(tmp, **BASE))])
    assert code == 1, text
    return text


def run_folder_refused(tmp: Path) -> str:
    (tmp / "embodied").mkdir()
    (tmp / "embodied" / "metrics.jsonl").write_text('{"step": 1}\n')  # an earlier run's
    return config_error(tmp=tmp)


def simulator_missing(tmp: Path) -> str:
    if importlib.util.find_spec("mani_skill") is not None:
        pytest.skip("mani_skill is installed here")
    code, text = printed_by_main(["--config", "configs/embodied_maniskill.yaml"])
    assert code == 2, text
    return text


def metaworld_missing(tmp: Path) -> str:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "metaworld", None)  # as in a venv without the extra
        code, text = printed_by_main(["--config", "configs/metaworld_push.yaml"])
    assert code == 2, text
    return text


def not_a_checkpoint(tmp: Path) -> str:
    (tmp / "nothing_here").mkdir()
    return config_error(f"runner.resume_dir={tmp / 'nothing_here'}", tmp=tmp)


def ray_too_few_nodes(tmp: Path) -> str:
    pytest.importorskip("ray")
    short = tempfile.TemporaryDirectory(dir="/tmp", ignore_cleanup_errors=True)  # Ray's socket paths: <= 107 bytes
    with pytest.MonkeyPatch.context() as mp, short as ray_tmp:
        mp.setenv("RAY_TMPDIR", ray_tmp)  # a private one-node Ray, whatever else runs on this machine
        mp.delenv("RAY_ADDRESS", raising=False)
        path = write_config(tmp, **_merge(BASE, {"cluster": {"backend": "ray", "ray_address": "local",
                                                             "num_nodes": 2}}))
        code, text = printed_by_main(["--config", str(path)])
    assert code == 2, text
    return text


def ray_nobody_at_the_address(tmp: Path) -> str:
    pytest.importorskip("ray")
    import socket

    with socket.socket() as sock:  # a port nobody listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = write_config(tmp, **_merge(BASE, {"cluster": {"backend": "ray", "ray_address": f"127.0.0.1:{port}"}}))
    code, text = printed_by_main(["--config", str(path)])
    assert code == 2 and text.count("\n") == 1, text
    return text


def ray_dead_address(tmp: Path) -> str:
    pytest.importorskip("ray")
    from rlinf_mini.scheduler.ray_backend import ray_address

    (tmp / "ray").mkdir()
    (tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:9\n")  # what `ray start --head` left; nobody there
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", str(tmp))
        address, note = ray_address("", {})
    assert address == "local", address
    return note


TRIGGERS = {  # the page's entry titles -> what makes its message happen; returns what was printed
    "An unknown key": lambda tmp: config_error("actor.optim.lrr=1e-3", tmp=tmp),
    "A value of the wrong type": lambda tmp: config_error("actor.optim.lr=fast", tmp=tmp),
    "Batch sizes that do not divide": lambda tmp: config_error("actor.global_batch_size=100", tmp=tmp),
    "A placement outside the devices": lambda tmp: config_error("cluster.component_placement.actor=0-3", tmp=tmp),
    "The config file does not exist": lambda tmp: config_error(config="configs/no_such_file.yaml", tmp=tmp),
    "The run folder already holds a run": run_folder_refused,
    "Resuming from a folder that is not a checkpoint": not_a_checkpoint,
    "A simulator that is not installed": simulator_missing,
    "MetaWorld is not installed": metaworld_missing,
    "An env id that does not exist": lambda tmp: config_error("env.train.env_type=gymnasium",
                                                              "env.train.init_params.id=NoSuchEnv-v0", tmp=tmp),
    "bf16 on a machine without a GPU": lambda tmp: config_error("actor.model.precision=bf16", tmp=tmp),
    "/dev/shm too small": shm_too_small,
    "Fewer devices than GPUs": lambda tmp: devices.fewer_devices_note(1, ["0", "1"]),
    "Two ranks on one GPU": lambda tmp: devices.collective_backend([("0",), ("0",)])[1],
    "A worker died": "kill9",
    "A worker raised": "raise_inline",
    "A hang: nothing arrived on a channel": "hang_env",
    "A hang: a group call did not return": group_call_timeout,
    "A worker did not start": start_timeout,
    "The weight sync timed out": weight_sync_timeout,
    "A NaN loss": "nan_inline",
    "The env raised": "broken_env_inline",
    "No Ray cluster at the address": ray_nobody_at_the_address,
    "The Ray cluster has fewer nodes than the config asks": ray_too_few_nodes,
    "A recorded Ray address where no cluster answers": ray_dead_address,
}


def test_the_page_lists_exactly_the_messages_this_test_triggers():
    assert sorted(page_entries()) == sorted(TRIGGERS)


@pytest.mark.parametrize("title", list(TRIGGERS))
def test_the_page_quotes_the_message_as_printed(title, runs, tmp_path):
    trigger = TRIGGERS[title]
    printed = runs.text(trigger) if isinstance(trigger, str) else trigger(tmp_path)
    assert_quoted(page_entries()[title], printed)


def test_a_quote_that_was_not_printed_fails():
    printed = "error: ActorGroup rank 0 (pid 41) died with signal SIGKILL\n"
    assert_quoted("error: ActorGroup rank 0 (pid <pid>) died with signal SIGKILL", printed)
    for wrong in ("error: ActorGroup rank 1 (pid <pid>) died with signal SIGKILL", "died with <how>\nerror: Actor"):
        with pytest.raises(AssertionError):
            assert_quoted(wrong, printed)


# --------------------------------------------------------------------------------------------------------------------
# Pseudocode: every name in the boxes is the code's


OPTIONAL = {"ray"}  # the extras a module may need; a module whose extra is absent is skipped (its names are not
# in the pseudocode: the boxes describe the default local backend)


def _all_modules() -> list:
    out = []
    for package in ("rlinf_mini", "stages"):
        root = importlib.import_module(package)
        out.append(root)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            try:
                out.append(importlib.import_module(info.name))
            except ModuleNotFoundError as e:
                if e.name not in OPTIONAL:
                    raise
    return out


@pytest.fixture(scope="module")
def code_names() -> dict[str, list]:
    """Every function and class defined at the top level of a module of rlinf_mini/ and stages/: name -> the objects
    of that name (a method is reached through its class)."""
    names: dict[str, list] = {}
    for module in _all_modules():
        for name, obj in vars(module).items():
            if callable(obj) and getattr(obj, "__module__", None) == module.__name__:  # not an import from elsewhere
                names.setdefault(name, []).append(obj)
    return names


GROUPS = {  # a box's group variables -> the worker (or runner) class its calls go to
    "ppo": {"runner": "EmbodiedRunner", "actor": "ActorWorker", "rollout": "RolloutWorker", "env": "EnvWorker",
            "policy": "MLPPolicy", "sub_envs": "TorchChunkEnv", "loader": "PromptLoader"},
    "grpo": {"runner": "ReasoningRunner", "actor": "ReasoningActorWorker", "rollout": "ReasoningRolloutWorker",
             "reward": "ReasoningRewardWorker", "loader": "PromptLoader"},
}
SECTIONS = tuple(f.name for f in dataclasses.fields(TrainConfig))
BUILTINS = {"range", "len", "sum", "max", "min"}


def readme_boxes() -> dict[str, str]:
    section = (ROOT / "README.md").read_text().split("## One step as pseudocode", 1)[1].split("\n## ", 1)[0]
    boxes = re.findall(r"^```text\n(.*?)^```", section, re.M | re.S)
    assert len(boxes) == 2, "the README's pseudocode section holds two boxes: embodied PPO, then reasoning GRPO"
    return {"ppo": boxes[0], "grpo": boxes[1]}


def tutorial_box(name: str) -> str:
    cells = [c.source for c in jupytext.read(ROOT / f"tutorials/{name}.py").cells if c.cell_type == "markdown"]
    cell = next(c for c in cells if "## One step as pseudocode" in c)
    return re.search(r"^```text\n(.*?)^```", cell, re.M | re.S).group(1)


def unresolved_names(box: str, groups: dict[str, str], code_names: dict[str, list]) -> list[str]:
    """The calls (`f(`: a function of the code or a method of the box's runner; `group.method(`: a public method of
    that group's worker class; `Class.method(`) and config keys (`section.key...`) of a box the code does not define."""

    def cls_named(name: str) -> type | None:
        return next((c for c in code_names.get(name, []) if isinstance(c, type)), None)

    missing = []
    for dotted in re.findall(r"(?<![\w./])([A-Za-z_][\w.]*)\(", box):
        *head, last = dotted.split(".")
        if not head:
            ok = last in BUILTINS or last in code_names or hasattr(cls_named(groups["runner"]), last)
        else:
            cls = cls_named(groups.get(head[0], head[0]))  # a group variable's worker class, or a class by name
            public = head[0] not in groups or not last.startswith("_")
            ok = cls is not None and len(head) == 1 and public and callable(getattr(cls, last, None))
        if not ok:
            missing.append(f"{dotted}(")
    for key in re.findall(rf"(?<![\w./])((?:{'|'.join(SECTIONS)})(?:\.\w+)+)(?![\w.(])", box):
        node = TrainConfig()
        for part in key.split("."):
            node = getattr(node, part, missing)  # `missing` as the sentinel: a key whose default is None exists
            if node is missing:
                missing.append(key)
                break
    return missing


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_every_name_in_the_pseudocode_is_the_codes(algo, code_names):
    box = readme_boxes()[algo]
    assert unresolved_names(box, GROUPS[algo], code_names) == []
    tutorial = {"ppo": "00_overview", "grpo": "07_reasoning"}[algo]
    assert tutorial_box(tutorial) == box, f"tutorials/{tutorial}.py's pseudocode is not the README's"


def test_a_name_the_code_lacks_is_found(code_names):
    box = ("actor.run_training()\nactor.run_trainnig()\ncompute_gea()\ntrain_step() step()\nalgorithm.gamma\n"
           "algorithm.gama\nEmbodiedRunner.run() EmbodiedRunner.walk()\n")
    assert unresolved_names(box, GROUPS["ppo"], code_names) == ["actor.run_trainnig(", "compute_gea(", "step(",
                                                                "EmbodiedRunner.walk(", "algorithm.gama"]


# --------------------------------------------------------------------------------------------------------------------
# The README a newcomer reads, and the pages it leads to

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bload (?:average )?~?\d|\bthis round\b|\b\d{1,2} Dec\b|\bDec \d{1,2}\b"
                   r"|\b(?:first|second|this) session\b|\btoday\b|\byesterday\b", re.I)
PENDING: set[str] = set()
"""Pages other branches add: linked already, allowed to be missing until they land. Empty this set once they
have."""
CODE = [p for d in ("rlinf_mini", "stages", "benchmarks", "tests", "tutorials", "configs")
        for p in sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".yaml", ".sh")]


def test_the_readme_is_short_and_its_first_block_holds_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first = text.split("```", 2)[1]
    commands = [ln for ln in first.splitlines()[1:] if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(commands) == 2 and "rlinf_mini.train" in commands[0] and commands[1].endswith("pytest"), commands
    assert all(c.startswith("pip install torch==2.13.0 && ") for c in commands)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_page_has_no_dated_or_load_sentence_and_its_links_resolve(page):
    text = page.read_text()
    dated = [m.group(0) for m in DATED.finditer(text)]
    assert not dated, f"{page.name}: {dated}: a figure's date and load belong in its benchmarks/*.json"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not re.match(r"[a-z]+://", target):
            if Path(target).name in PENDING and not (page.parent / target).exists():
                continue
            assert (page.parent / target).exists(), f"{page.name}: the link {target} leads nowhere"


def test_the_readme_and_the_docs_index_link_every_page():
    for index in (ROOT / "README.md", ROOT / "docs/index.md"):
        text = index.read_text()
        pages = {p.name for p in (ROOT / "docs").glob("*.md")} | PENDING
        unlinked = sorted(name for name in pages - {index.name} if name not in text)
        assert not unlinked, f"{index.relative_to(ROOT)} does not link {unlinked}"


def test_no_code_comment_holds_a_dated_or_load_figure():
    """A measurement lives in a benchmarks/*.json that records its date, commit, machine and load."""
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in CODE if p.name != "test_docs.py"
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if "#" in line and DATED.search(line.split("#", 1)[1])]
    assert not found, "\n".join(found)


def test_one_env_var_prefix_and_every_variable_documented():
    """Every environment variable of ours is RLINF_MINI_...: no other prefix, and each is listed in docs/testing.md
    or docs/troubleshooting.md."""
    docs = (ROOT / "docs/testing.md").read_text() + (ROOT / "docs/troubleshooting.md").read_text()
    old = "RL" + "MINI_"  # the prefix that was dropped (spelt in two pieces so that this file does not hold it)
    names: set[str] = set()
    for p in CODE + PAGES:
        text = p.read_text(errors="replace")
        assert old not in text, f"{p.relative_to(ROOT)}: the old prefix {old} (ours is RLINF_MINI_)"
        names |= set(re.findall(r"\bRLINF_MINI_[A-Z0-9_]*[A-Z0-9]", text))
    assert "RLINF_MINI_FAULT" in names and "RLINF_MINI_TEST_FAULT_CASES" in names
    undocumented = sorted(n for n in names if not re.search(rf"`{n}`", docs))
    assert not undocumented, f"not in docs/testing.md or docs/troubleshooting.md: {undocumented}"


def test_a_dated_sentence_and_a_dead_link_are_found(tmp_path):
    assert DATED.search("measured 2026-12-02 at load 6.4") and DATED.search("on 2 Dec, load average 3")
    assert not DATED.search("eval success 0.09 -> 0.91 at step 300, load the config")
    page = tmp_path / "page.md"
    page.write_text("[here](nowhere.md)")
    with pytest.raises(AssertionError, match="leads nowhere"):
        test_a_page_has_no_dated_or_load_sentence_and_its_links_resolve(page)


def test_the_readme_picture_is_drawn_from_a_run_folders_metrics_and_trace(tmp_path):
    """benchmarks/readme_figure.py draws the README's picture from metrics.jsonl and trace.json alone (two driver
    steps here: the last one's spans are drawn); a folder without them is one line naming what is missing."""
    from benchmarks import readme_figure
    from rlinf_mini.scheduler.tracer import write_chrome_trace

    ms = 1_000_000  # ns
    spans = [("driver", 0, "step", -1, 0, 10 * ms), ("driver", 0, "step", -1, 10 * ms, 30 * ms),
             ("driver", 0, "generate_rollouts", -1, 10 * ms, 20 * ms), ("EnvGroup", 0, "env_step", 0, 11 * ms, 12 * ms),
             ("RolloutGroup", 0, "inference", 1, 12 * ms, 13 * ms), ("ActorGroup", 0, "wait_x", -1, 10 * ms, 20 * ms),
             ("ActorGroup", 0, "forward_backward", -1, 20 * ms, 29 * ms),
             ("EnvGroup", 0, "env_step", 0, 1 * ms, 2 * ms)]
    write_chrome_trace(spans, tmp_path / "trace.json")
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/success_once": 0.1}\n{"step": 1}\n'
                                             '{"step": 2, "eval/success_once": 0.9}\n')
    assert readme_figure.eval_curve(tmp_path / "metrics.jsonl") == ([0, 2], [0.1, 0.9])
    events, names, t0 = readme_figure.last_step_events(tmp_path / "trace.json")
    assert t0 == 10_000 and sorted(names[(e["pid"], e["tid"])] for e in events if e["name"] == "env_step") == \
        ["EnvGroup:0"] and len(events) == 6  # the first step's env_step and step span are left out
    out = readme_figure.draw(tmp_path, tmp_path / "img" / "readme.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="no metrics.jsonl, trace.json"):
        readme_figure.main(["--run-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")])
