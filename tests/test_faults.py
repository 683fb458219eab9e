"""Faults injected into real runs (`python -m rlinf_mini.train`, RLINF_MINI_FAULT): a worker killed, segfaulting,
exiting, raising, hanging, returning a NaN loss; a broken env; SIGTERM and a second Ctrl-C on the driver. Every case
asserts the message, the exit code, that the driver reacted to the event itself (the fault, the signal) and not to
some later timeout, and that no process and no /dev/shm segment is left.

No bound here is a stopwatch on the whole run, which a loaded machine stretches (a run's start is seconds of CPU, and
three go at once): each is measured from the event it answers (the fault's own timestamp, the signal sent), and is
generous, a fraction of the timeout the run would otherwise have waited out.

The runs are started a few at a time (each spends seconds importing torch) by one module fixture; the tests read
their results. A few in-process cases (a driver blocked in a channel get) share one cluster.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from conftest import ROOT, marked_processes, write_config
from toy_workers import EchoWorker

from rlinf_mini.runners.base import find_latest_checkpoint
from rlinf_mini.scheduler import faults
from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.shm import PREFIX, SHM_DIR
from rlinf_mini.scheduler.worker import WorkerDiedError
from rlinf_mini.utils.metric_logger import read_metrics
from stages.placement import ComponentPlacement

BASE = dict(  # 3 worker processes (each run spends most of its time starting them), a fraction of a second per step
    cluster={"num_devices": 2, "component_placement": {"env,rollout": "0", "actor": "1"}, "timeout_s": 60},
    runner={"max_epochs": 3, "val_check_interval": -1, "save_interval": 1, "progress_bar": False,
            "logger": {"logger_backends": []}},
    env={"train": {"total_num_envs": 16, "max_steps_per_rollout_epoch": 8},
         "eval": {"total_num_envs": 8, "max_steps_per_rollout_epoch": 8}},
    actor={"global_batch_size": 64, "micro_batch_size": 32},
)
MARKER_VAR = "RLINF_MINI_TEST_FAULT_RUN"  # inherited by every worker: finds the run's processes in /proc
BROKEN_ENV = {"env_type": "gymnasium", "max_episode_steps": 8}
DATA_PARALLEL = {"cluster": {"component_placement": {"env,rollout": "0", "actor": "0-1"}}}  # NaN flags must agree
HANG_TIMEOUT_S = 15  # the hang cases' cluster.timeout_s: every wait's, the ranks' start too (an inline run's
# init_worker takes seconds on a busy machine)
# A death or an exception is noticed by the event itself (a rank's pipe closes, its error arrives), not by the 60 s
# timeout every wait has (BASE): the driver's stop must come in under half of it (a few seconds on a busy machine).
NOTICE_LIMIT_S = BASE["cluster"]["timeout_s"] / 2
# A hang is reported once HANG_TIMEOUT_S has passed (not before), and within this much more: the rank's timeout fires
# and the driver stops the others (the inline driver's own timeout is timeout_s + 5 s).
HANG_REPORT_LIMIT_S = 60
STOP_LIMIT_S = 30  # SIGTERM / Ctrl-C: the run stops instead of training 1000 epochs
LEFTOVER_WAIT_S = 10  # a run's processes end within this of its driver's exit (event-bounded, see _Started.finish)
RUN_GUARD_S = 240  # a hang guard: a run not ended by then is killed, and its test fails saying so
pytestmark = pytest.mark.timeout(1200)  # the module fixture's 15 runs count against the first test's limit


@dataclasses.dataclass
class Case:
    expect_code: int
    fault: str | None = None
    config: dict = dataclasses.field(default_factory=dict)  # sections merged into BASE
    signals: tuple[int, ...] = ()  # sent to the driver, 0.5 s apart, once the first checkpoint exists


CASES = {
    "kill9_actor_in_training": Case(1, "group=ActorGroup,rank=0,method=run_training,call=2,kind=kill9"),
    "segv_env_while_others_wait_in_channel_gets": Case(1, "group=EnvGroup,rank=0,method=interact,call=2,kind=segv"),
    "exit_rollout": Case(1, "group=RolloutGroup,method=generate,call=1,kind=exit"),
    "kill9_rollout_during_init": Case(1, "group=RolloutGroup,method=init_worker,kind=kill9"),
    "raise_in_actor_rank1": Case(1, "group=ActorGroup,rank=1,method=compute_advantages_and_returns,call=2,kind=raise",
                                 DATA_PARALLEL),
    "hang_env": Case(1, "group=EnvGroup,method=interact,call=2,kind=hang", {"cluster": {"timeout_s": HANG_TIMEOUT_S}}),
    "nan_loss_rank1": Case(1, "group=ActorGroup,rank=1,method=run_training,call=2,kind=nan", DATA_PARALLEL),
    "nan_loss_skipped": Case(0, "group=ActorGroup,rank=1,method=run_training,call=2,kind=nan",
                             {**DATA_PARALLEL, "actor": {"skip_nonfinite": True}}),
    "broken_env_step": Case(1, None, {"env": {
        "train": {**BROKEN_ENV, "init_params": {"id": "toy_envs:BrokenStep-v0"}},
        "eval": {**BROKEN_ENV, "init_params": {"id": "toy_envs:BrokenStep-v0"}}}}),
    "broken_env_reset": Case(1, None, {"env": {
        "train": {**BROKEN_ENV, "init_params": {"id": "toy_envs:BrokenReset-v0"}},
        "eval": {**BROKEN_ENV, "init_params": {"id": "toy_envs:BrokenReset-v0"}}}}),
    "sigterm": Case(143, None, {"runner": {"max_epochs": 1000}}, signals=(signal.SIGTERM,)),
    # the env hangs, so a clean stop must wait out the grace period; the second Ctrl-C skips it
    "second_ctrl_c": Case(130, "group=EnvGroup,method=interact,call=3,kind=hang", {"runner": {"max_epochs": 1000}},
                          signals=(signal.SIGINT, signal.SIGINT)),
    # a crash of the driver itself (SIGKILL: no handler, no atexit) while a rank hangs in a call: nothing outlives it
    "kill9_driver_while_env_hangs": Case(-signal.SIGKILL, "group=EnvGroup,method=interact,call=3,kind=hang",
                                         {"runner": {"max_epochs": 1000}}, signals=(signal.SIGKILL,)),
    # the inline backend (every rank a thread of the driver) reports and stops the same way
    "raise_in_actor_rank1_inline": Case(
        1, "group=ActorGroup,rank=1,method=compute_advantages_and_returns,call=2,kind=raise",
        {**DATA_PARALLEL, "cluster": {**DATA_PARALLEL["cluster"], "backend": "inline"}}),
    "hang_env_inline": Case(1, "group=EnvGroup,method=interact,call=2,kind=hang",
                            {"cluster": {"timeout_s": HANG_TIMEOUT_S, "backend": "inline"}}),
    "ctrl_c_inline": Case(130, None, {"runner": {"max_epochs": 1000}, "cluster": {"backend": "inline"}},
                          signals=(signal.SIGINT,)),
}


@dataclasses.dataclass
class Run:
    returncode: int
    stderr: str
    run_dir: Path
    seconds: float  # start to exit (printed, not asserted)
    exit_time: float  # time.time() when the driver was seen gone
    report_time: float | None  # time.time() when its "error: " line was first seen (None: none)
    killed: bool  # by the fixture's guard (RUN_GUARD_S)
    signal_times: list[float]
    spawned: set[int]  # worker pids seen while it ran
    leftover: dict[int, bytes]  # any process of the run alive after it exited: pid -> command line
    segments: list[str]  # its /dev/shm segments left behind


def _marked(marker: str) -> dict[int, bytes]:
    return marked_processes(MARKER_VAR, marker)


class _Started:
    def __init__(self, name: str, case: Case, tmp: Path):
        self.name, self.case = name, case
        self.marker = uuid.uuid4().hex
        self.log_path = tmp / "results"
        path = write_config(tmp, **_merge(BASE, case.config))
        env = {**os.environ, MARKER_VAR: self.marker, "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
        env.pop(faults.ENV_VAR, None)
        if case.fault:
            env[faults.ENV_VAR] = case.fault
        self.err = open(tmp / "stderr", "w+")  # noqa: SIM115 (closed in finish)
        self.start = time.monotonic()
        # the file holds log_path (write_config): no flag, so the run reads its config without tyro's parser
        self.proc = subprocess.Popen([sys.executable, "-m", "rlinf_mini.train", "--config", str(path)],
                                     cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self.err,
                                     stdin=subprocess.DEVNULL)
        self.spawned: set[int] = set()
        self.signal_times: list[float] = []
        self.exit_time = self.report_time = None
        self.killed = False

    @property
    def run_dir(self) -> Path:
        return self.log_path / "embodied"

    def tick(self) -> None:
        stderr = Path(self.err.name).read_text()
        if self.report_time is None and error_lines(stderr):
            self.report_time = time.time()
        if self.proc.poll() is not None:
            if self.exit_time is None:
                self.exit_time = time.time()
            return
        # the ranks, forked by the run's fork server (scheduler/local.py), and the server itself (a fork of the
        # driver: the driver's command line): every process of the run but the driver and multiprocessing's tracker
        self.spawned |= {pid for pid, cmd in _marked(self.marker).items()
                         if pid != self.proc.pid and b"resource_tracker" not in cmd}
        pending = self.case.signals[len(self.signal_times):]
        ready = (self.run_dir / "checkpoints").is_dir() and find_latest_checkpoint(self.run_dir) is not None
        if self.case.fault and "kind=hang" in self.case.fault:  # signal a run that hangs, not one about to
            ready = ready and "[rlmini fault]" in stderr
        if pending and ready and (not self.signal_times or time.time() - self.signal_times[-1] > 0.5):
            self.signal_times.append(time.time())
            self.proc.send_signal(pending[0])

    def finish(self) -> Run:
        self.tick()
        seconds = time.monotonic() - self.start
        # SIGKILLed processes end (and are reaped) a moment after the driver: under load that moment can grow
        # past a fixed grace, so wait for the event, bounded; a process that outlives the run
        # is still there at the bound
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        while _marked(self.marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        with self.err:
            self.err.seek(0)
            stderr = self.err.read()
        segments = [n for n in os.listdir(SHM_DIR) if n.startswith(f"{PREFIX}{self.proc.pid}")]
        if self.report_time is None and error_lines(stderr):  # written just before it exited
            self.report_time = self.exit_time
        return Run(self.proc.returncode, stderr, self.run_dir, seconds, self.exit_time, self.report_time, self.killed,
                   self.signal_times, self.spawned, _marked(self.marker), segments)


def _merge(base: dict, new: dict) -> dict:
    out = json.loads(json.dumps(base))
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "component_placement":
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


AT_ONCE = 3  # runs going at the same time: their starts are CPU-bound, their timeouts and grace periods are waits


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    todo = [(n, c) for n, c in CASES.items() if n in os.environ.get("RLINF_MINI_TEST_FAULT_CASES", n)]
    todo.sort(key=lambda nc: "kind=hang" not in (nc[1].fault or ""))  # the longest (a timeout to wait out) first
    active: list[_Started] = []
    done: dict[str, Run] = {}
    while todo or active:
        while todo and len(active) < AT_ONCE:
            name, case = todo.pop(0)
            active.append(_Started(name, case, tmp_path_factory.mktemp(name)))
        for run in list(active):
            run.tick()
            if run.proc.poll() is not None:
                done[run.name] = run.finish()
                active.remove(run)
            elif time.monotonic() - run.start > RUN_GUARD_S:
                run.killed = True
                run.proc.kill()
                run.proc.wait()
                done[run.name] = run.finish()
                active.remove(run)
        time.sleep(0.1)
    for name, run in done.items():  # the figures the bounds below are set against (pytest -s shows them)
        fault = re.search(r"\[rlmini fault\] .* at t=([\d.]+)", run.stderr)
        since = {"fault": float(fault.group(1)) if fault else None, "signal": (run.signal_times or [None])[-1]}
        report = run.report_time if run.report_time is not None else float("nan")
        print(f"{name}: {run.seconds:.1f} s start to exit; " + "; ".join(
            f"report {report - t:.1f} s, exit {run.exit_time - t:.1f} s after the {what}"
            for what, t in since.items() if t is not None) + f" (load {os.getloadavg()[0]:.1f})")
    return done


def fault_time(stderr: str) -> float:
    return float(re.search(r"\[rlmini fault\] .* at t=([\d.]+)", stderr).group(1))


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error: ")]


def assert_clean_end(run: Run, inline: bool = False) -> None:
    assert not run.killed, f"the run had not ended {RUN_GUARD_S} s after its start: killed"
    assert inline or run.spawned, "no worker was ever seen: the case did not run"
    assert not inline or not run.spawned, "the inline backend started worker processes"
    assert not run.leftover, f"processes outlived the run: {run.leftover}"
    assert run.segments == [], f"shared memory outlived the run: {run.segments}"


@pytest.mark.parametrize("name, group, rank, how", [
    ("kill9_actor_in_training", "ActorGroup", 0, "signal SIGKILL"),
    ("segv_env_while_others_wait_in_channel_gets", "EnvGroup", 0, "signal SIGSEGV"),
    ("exit_rollout", "RolloutGroup", 0, "exit code 3"),
    ("kill9_rollout_during_init", "RolloutGroup", 0, "signal SIGKILL"),
])
def test_worker_death_is_one_line_with_group_rank_pid_and_how(runs, name, group, rank, how):
    run = runs[name]
    assert run.returncode == 1, run.stderr
    pid = int(re.search(r"pid (\d+):", run.stderr).group(1))  # from the fault's own line
    lines = error_lines(run.stderr)
    assert lines == [f"error: {group} rank {rank} (pid {pid}) died with {how}"], run.stderr
    assert run.exit_time - fault_time(run.stderr) < NOTICE_LIMIT_S, "the driver did not stop on the death itself"
    assert_clean_end(run)


@pytest.mark.parametrize("name", ["raise_in_actor_rank1", "raise_in_actor_rank1_inline"])
def test_worker_exception_carries_traceback_group_and_rank(runs, name):
    run = runs[name]
    assert run.returncode == 1
    assert "error: ActorGroup rank 1 raised in compute_advantages_and_returns()" in run.stderr
    assert "Traceback" in run.stderr and "FaultInjected: injected fault in compute_advantages_and_returns() call 2" \
        in run.stderr
    assert run.exit_time - fault_time(run.stderr) < NOTICE_LIMIT_S, "the driver did not stop on the error itself"
    assert_clean_end(run, inline=name.endswith("inline"))


def assert_reported_after_the_timeout(run: Run) -> None:
    """The hang's report came after its timeout, not before, and within a generous limit on top of it."""
    since_hang = run.report_time - fault_time(run.stderr)
    assert HANG_TIMEOUT_S <= since_hang, f"reported {since_hang:.1f} s after the hang: before the timeout"
    assert since_hang < HANG_TIMEOUT_S + HANG_REPORT_LIMIT_S, f"reported only {since_hang:.1f} s after the hang"


@pytest.mark.parametrize("name", ["hang_env", "hang_env_inline"])
def test_hang_becomes_a_timeout_naming_the_channel_key_and_the_producer(runs, name):
    run = runs[name]
    assert run.returncode == 1
    (line,) = error_lines(run.stderr)
    # inline: ranks take turns, and the hung env keeps its turn. A rank already waiting in its get when the env hung
    # (the rollout for observations, or the actor for trajectories) reports its ChannelTimeout naming the env, as on
    # local; if none was, none can begin, and the driver's timeout names who holds the turn.
    if name.endswith("inline") and "raised in" in line:
        assert re.search(r"error: (ActorGroup rank \d raised in recv_rollout_trajectories|RolloutGroup rank \d raised "
                         r"in generate)\(\)", line), run.stderr
        assert re.search(rf"ChannelTimeout: channel '\w+\.\w+' key .*: nothing arrived within {HANG_TIMEOUT_S} s, "
                         r"expected from EnvGroup rank 0", run.stderr), run.stderr
        assert_reported_after_the_timeout(run)
        assert_clean_end(run, inline=True)
        return
    if name.endswith("inline"):
        assert re.search(r"error: ActorGroup\.recv_rollout_trajectories\(\) did not return from rank\(s\) \[\d\] "
                         r"within \d+ s .*; on the inline backend EnvGroup rank 0 has held the turn for \d+ s, in "
                         r"interact\(\)", line), run.stderr
        assert_reported_after_the_timeout(run)
        assert_clean_end(run, inline=True)
        return
    # the actor waited for its trajectories from the (hung) env: the key, the channel and the producer are named
    assert re.search(r"error: ActorGroup rank \d raised in recv_rollout_trajectories\(\)", line), run.stderr
    assert re.search(rf"ChannelTimeout: channel 'ActorGroup\.Actor' key \('traj', \d\): nothing arrived within "
                     rf"{HANG_TIMEOUT_S} s, expected from EnvGroup rank 0", run.stderr), run.stderr
    assert_reported_after_the_timeout(run)
    assert_clean_end(run, inline=name.endswith("inline"))


def test_nan_loss_stops_the_run_naming_step_and_rank_and_no_checkpoint_holds_it(runs):
    run = runs["nan_loss_rank1"]
    assert run.returncode == 1
    assert re.search(r"NonFiniteError: non-finite loss at global step 1 \(update epoch 0, sample 0\) on ActorGroup "
                     r"rank\(s\) \[1\]", run.stderr), run.stderr
    ckpts = sorted(p.name for p in (run.run_dir / "checkpoints").iterdir())
    assert ckpts == ["global_step_1"]  # the step with the NaN never reached a checkpoint
    state = torch.load(run.run_dir / "checkpoints/global_step_1/actor/actor.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert_clean_end(run)


def test_nan_loss_with_skip_nonfinite_skips_the_step_and_carries_on(runs):
    run = runs["nan_loss_skipped"]
    assert run.returncode == 0, run.stderr
    assert "ActorGroup rank(s) [1]: step skipped (actor.skip_nonfinite)" in run.stderr
    rows = read_metrics(run.run_dir / "metrics.jsonl")
    # the fault poisons every loss of step 2's run_training(): its 2 optimizer steps per update epoch x 4 epochs
    assert [r["train/skipped_steps"] for r in rows] == [0.0, 8.0, 0.0]
    assert all(v == v for r in rows for k, v in r.items() if k.startswith("train/"))  # no NaN in the losses
    state = torch.load(find_latest_checkpoint(run.run_dir) / "actor/actor.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert_clean_end(run)


@pytest.mark.parametrize("name, method, call", [("broken_env_step", "chunk_step", "interact"),
                                                ("broken_env_reset", "reset", "init_worker")])  # the first reset
def test_broken_env_is_reported_with_its_rank_and_pipeline_stage(runs, name, method, call):
    run = runs[name]
    assert run.returncode == 1
    (line,) = error_lines(run.stderr)
    assert line == f"error: EnvGroup rank 0 raised in {call}():", line
    assert re.search(rf"EnvFailure: EnvGroup rank 0 env\.train pipeline stage 0 \(sub-envs 0-7\): env {method}\(\) "
                     r"raised RuntimeError: .*\(planned\)", run.stderr), run.stderr
    assert_clean_end(run)


def test_sigterm_stops_every_worker_and_keeps_the_last_checkpoint(runs):
    run = runs["sigterm"]
    assert run.returncode == 143, run.stderr
    assert "interrupted: all workers stopped (SIGTERM)" in run.stderr
    assert run.exit_time - run.signal_times[0] < STOP_LIMIT_S
    ckpt = find_latest_checkpoint(run.run_dir)
    state = torch.load(ckpt / "actor" / "actor.pt", weights_only=True)
    assert state["model"] and (ckpt / "rng.pt").is_file()
    assert_clean_end(run)


def test_ctrl_c_on_the_inline_backend_stops_the_run(runs):
    run = runs["ctrl_c_inline"]
    assert run.returncode == 130, run.stderr
    assert "interrupted: all workers stopped (SIGINT)" in run.stderr
    assert run.exit_time - run.signal_times[0] < STOP_LIMIT_S
    assert (find_latest_checkpoint(run.run_dir) / "rng.pt").is_file()
    assert_clean_end(run, inline=True)


def test_second_ctrl_c_kills_at_once(runs):
    run = runs["second_ctrl_c"]
    assert run.returncode == 130, run.stderr
    assert len(run.signal_times) == 2 and "SIGINT again: killing every worker now" in run.stderr
    # the clean stop waits out a 3 s grace period for the hung env and then says so; the second Ctrl-C, 0.5 s after
    # the first, kills every worker and exits before that line
    assert "interrupted: all workers stopped" not in run.stderr, run.stderr
    assert_clean_end(run)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (one whose reaper is slow has ended all the same)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_driver_leaves_no_process_even_with_a_hung_rank(runs):
    run = runs["kill9_driver_while_env_hangs"]
    assert run.returncode == -signal.SIGKILL and run.signal_times and not run.killed, run.stderr
    assert run.spawned, "no worker was ever seen: the case did not run"
    # the fork server ends at its lifeline's end-of-file (the driver held the only write end), and each rank with it
    # (PR_SET_PDEATHSIG), the hung one too: wait for that event, bounded
    deadline = time.monotonic() + STOP_LIMIT_S
    alive = set(run.leftover)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = {pid for pid in alive if _running(pid)}
    assert alive == set(), f"processes outlived the killed driver by {STOP_LIMIT_S} s: {alive}"
    # a killed driver cannot free its /dev/shm segments: the next run sweeps them (test_backends.py); here, this test
    for name in run.segments:
        (Path(SHM_DIR) / name).unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------------------------
# In this process: a driver blocked in a channel get


@pytest.fixture(scope="module")
def cluster_timeout_s() -> float:
    """conftest's `cluster`, with 30 s timeouts here."""
    return 30.0


def test_driver_blocked_in_a_channel_get_notices_a_death(cluster):
    group = EchoWorker.create_group(None).launch(cluster, ComponentPlacement({"p": "0"}, 2).get_strategy("p"),
                                                 name="Producer")
    pid = group.info().wait()[0]["pid"]
    ch = Channel.create("from_producer", cluster)
    group.sleep(0.5)
    os.kill(pid, signal.SIGKILL)  # the producer dies instead of putting anything
    with pytest.raises(WorkerDiedError, match=rf"Producer rank 0 \(pid {pid}\) died with signal SIGKILL"):
        ch.get(key="never", expected_from="Producer rank 0")  # would otherwise block for 30 s
    group.shutdown()
    cluster.groups.remove(group)


def test_rng_states_round_trip_through_every_rank(cluster):
    group = EchoWorker.create_group(None).launch(cluster, ComponentPlacement({"r": "0-1"}, 2).get_strategy("r"),
                                                 name="Rng")
    states = group.get_rng_state().wait()
    first = group.draw().wait()
    for rank, state in enumerate(states):
        group.execute_on(rank).set_rng_state(state).wait()
    assert group.draw().wait() == first  # python, numpy and torch draws all repeat
    assert group.draw().wait() != first
    group.shutdown()
    cluster.groups.remove(group)


def test_fault_plan_is_read_strictly():
    assert faults.parse("group=A,rank=1,method=m,call=2,kind=hang") == faults.Fault("m", "hang", "A", 1, 2)
    for bad in ("method=m", "kind=raise", "method=m,kind=boom", "method=m,kind=raise,rank=x", "mehtod=m,kind=raise"):
        with pytest.raises(ValueError, match=faults.ENV_VAR):
            faults.parse(bad)


def test_malformed_fault_plan_is_a_one_line_error_before_any_worker(monkeypatch, capsys, tmp_path):
    from rlinf_mini.train import main

    monkeypatch.setenv(faults.ENV_VAR, "method=run_training,kind=explode")
    assert main(["--config", str(write_config(tmp_path, **BASE))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and faults.ENV_VAR in err and "explode" in err

