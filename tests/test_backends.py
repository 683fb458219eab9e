"""One API, several backends (scheduler/backend.py): the same calls and channels behave the same on local and inline,
the same config trains bitwise the same on both, inline runs every rank in the driver (a breakpoint stops there),
and the local backend's cleanup holds when the driver itself is killed. The Ray backend has its own file
(test_ray.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import ROOT, write_config
from toy_workers import DebugWorker

from rlinf_mini.config import ClusterConfig, load_config
from rlinf_mini.scheduler.channel import Channel, ChannelTimeout
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.scheduler.local import KILL_WAIT_S, LocalRanks
from rlinf_mini.scheduler.shm import PREFIX, SHM_DIR
from rlinf_mini.scheduler.worker import WorkerDiedError, WorkerError
from rlinf_mini.train import RunPlan, launch
from stages.placement import ComponentPlacement

BACKENDS = ["local", "inline"]


@pytest.fixture(scope="module", params=BACKENDS)
def cluster_backend(request) -> str:
    """Every test of this module on each backend (conftest's `cluster` and `echo`)."""
    return request.param


def test_calls_fan_out_and_return_in_rank_order(echo):
    assert echo.add(1, b=2).wait() == [3, 4]
    assert echo.execute_on(1).add(10).wait() == [11]
    infos = echo.info().wait()
    assert [i["rank"] for i in infos] == [0, 1] and all(i["tag"] == "hello" and i["group"] == "Echo" for i in infos)


def test_an_exception_names_group_rank_method_and_the_real_line(echo):
    with pytest.raises(WorkerError) as exc:
        echo.fail(1).wait()
    msg = str(exc.value)
    assert "Echo rank 1 raised in fail()" in msg and "planned failure on rank 1" in msg
    assert 'toy_workers.py", line' in msg and "in fail" in msg  # the traceback points at the worker's own code
    assert echo.add(0).wait() == [0, 1]  # the rank survives its exception


def test_a_wait_times_out_naming_the_call_and_its_ranks(echo):
    with pytest.raises(TimeoutError, match=r"Echo.sleep\(\) did not return from rank\(s\) \[0, 1\]"):
        echo.sleep(1.0).wait(timeout=0.2)
    assert echo.add(0).wait() == [0, 1]  # a rank runs its calls in order: this returns once the sleeps have finished


def test_channels_keys_bounds_timeouts_and_tensors(cluster, echo):
    ch = Channel.create("chan", cluster, maxsize=3)
    echo.execute_on(0).produce(ch, [1, 2, 3], "a").wait()
    assert ch.qsize("a") == 3
    with pytest.raises(ChannelTimeout, match=r"channel 'chan' key 'a': still full after 0.2 s"):
        ch.put(4, key="a", timeout=0.2)
    assert echo.execute_on(1).consume(ch, 3, "a").wait() == [[1, 2, 3]]
    big = {"images": torch.randint(0, 255, (64, 3, 64, 64), dtype=torch.uint8), "x": torch.randn(5)}
    ch.put(big, key="t")
    big["x"].zero_()  # the consumer got a copy, as across a process boundary
    got = echo.execute_on(0).consume(ch, 1, "t").wait()[0][0]
    assert torch.equal(got["images"], big["images"]) and not torch.equal(got["x"], big["x"])
    with pytest.raises(ChannelTimeout, match=r"nothing arrived .* expected from Nobody"):
        ch.get(key="empty", timeout=0.2, expected_from="Nobody")


# ---------------------------------------------------------------------------------------------------------------------
# inline: every rank is a thread of the driver


def test_inline_runs_worker_methods_in_the_driver_so_a_breakpoint_stops_there(monkeypatch):
    seen = []

    def hook(*args, **kwargs):  # what pdb would be: called in the frame of the breakpoint() line
        frame = sys._getframe(1)
        seen.append((os.getpid(), threading.current_thread().name, frame.f_code.co_name, frame.f_locals["y"]))

    monkeypatch.setattr(sys, "breakpointhook", hook)
    c = Cluster(ClusterConfig(num_devices=2, timeout_s=20, backend="inline"))
    try:
        group = DebugWorker.create_group(None).launch(c, ComponentPlacement({"d": "0-1"}, 2).get_strategy("d"),
                                                      name="Debug")
        assert group.stop_here(10).wait() == [10, 11]
    finally:
        c.shutdown()
    assert sorted(seen) == [(os.getpid(), "Debug:0", "stop_here", 10), (os.getpid(), "Debug:1", "stop_here", 11)]


def _train(tmp_path, backend: str, **cluster):
    """Two PPO steps of the MLP run with two actor ranks (an all-reduce) and two pipeline stages; returns the last
    step's trajectories (both actor ranks), the trained actor weights and every rollout rank's synced weights."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_config(tmp_path, cluster={"backend": backend, **cluster},
                        runner={"max_epochs": 2, "val_check_interval": -1, "save_interval": -1,
                                "progress_bar": False, "logger": {"logger_backends": []}},
                        env={"train": {"total_num_envs": 16, "max_steps_per_rollout_epoch": 8}},
                        actor={"global_batch_size": 64, "micro_batch_size": 32})
    cfg = load_config(["--config", str(path)])
    plan = RunPlan(cfg, str(path))
    assert plan.world_sizes["actor"] == 2 and cfg.rollout.pipeline_stage_num == 2
    plan.run_dir.mkdir(parents=True)
    cluster = Cluster(cfg.cluster)
    try:
        runner = launch(cfg, plan, cluster)
        runner.init_workers()
        if backend == "local":  # a spawned rank is the driver's child; a forked one the fork server's
            parents = {int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
                       for g in runner.groups for pid in g.pids}
            assert (parents == {os.getpid()}) == (cfg.cluster.rank_start == "spawn"), parents
        history = runner.run()
        runner.update_rollout_weights()
        return (history, runner.actor.get_rollout_batch().wait(), runner.actor.get_state_dict().wait(),
                runner.rollout.get_state_dict().wait())
    finally:
        cluster.shutdown()


def test_local_and_inline_train_bitwise_the_same(tmp_path):
    _assert_same_training(tmp_path, _train(tmp_path / "local", "local"), _train(tmp_path / "inline", "inline"))


def test_the_local_backend_s_plain_paths_train_bitwise_the_same_as_its_fast_ones(tmp_path):
    """cluster.rank_start 'spawn' (no fork server, no preloading), cluster.channel_wait 'block' (no spin) and
    cluster.all_reduce 'gloo' (not the shared-memory sum): the plain paths, against the defaults."""
    plain = _train(tmp_path / "plain", "local", rank_start="spawn", channel_wait="block", all_reduce="gloo")
    _assert_same_training(tmp_path, _train(tmp_path / "fast", "local"), plain)


def _assert_same_training(tmp_path, local, inline) -> None:
    for a, b in zip(local[1], inline[1], strict=True):  # trajectories and advantages, per actor rank
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k], k
    for a, b in zip(local[2] + local[3], inline[2] + inline[3], strict=True):  # actor ranks, then rollout ranks
        for k in a:
            assert torch.equal(a[k], b[k]), k
    assert any(not torch.equal(v, local[3][0][k]) for k, v in _initial_weights(tmp_path).items())  # it trained
    for h_local, h_inline in zip(local[0], inline[0], strict=True):
        for k in ("env/reward", "train/actor/policy_loss", "train/critic/value_loss", "rollout/advantages"):
            assert h_local.get(k) == h_inline.get(k), k


def _initial_weights(tmp_path) -> dict:
    from rlinf_mini.envs import get_env_spec
    from rlinf_mini.models import build_policy

    cfg = load_config(["--config", str(ROOT / "configs/embodied_mlp.yaml")])
    spec = get_env_spec(cfg.env.train)
    torch.manual_seed(cfg.actor.seed)
    return build_policy(cfg.actor.model, spec.obs_dim, spec.action_dim, spec.discrete).state_dict()


# ---------------------------------------------------------------------------------------------------------------------
# local: what a user found by trying


def test_segments_of_a_run_whose_driver_was_killed_are_swept_by_the_next_run():
    code = ("import os, signal\n"
            "from rlinf_mini.config import ClusterConfig\n"
            "from rlinf_mini.scheduler.cluster import Cluster\n"
            "from rlinf_mini.scheduler.shm import SharedSegment\n"
            "c = Cluster(ClusterConfig(num_devices=2))\n"
            "s = SharedSegment.create(4096, tag='orphan')\n"
            "print(s.name, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    name = proc.stdout.strip()
    assert name.startswith(PREFIX) and (SHM_DIR / name).exists()  # kill -9: no cleanup ran
    c = Cluster(ClusterConfig(num_devices=2))
    try:
        assert not (SHM_DIR / name).exists()
    finally:
        c.shutdown()


def test_an_unbounded_local_key_states_its_bound_and_why(tmp_path):
    c = Cluster(ClusterConfig(num_devices=2, timeout_s=20))
    try:
        ch = Channel.create("unbounded", c, maxsize=0)
        n = 0
        with pytest.raises(ChannelTimeout) as exc:
            while n < 100_000:
                ch.put(n, key="k", timeout=0.05)
                n += 1
        assert n > 200  # hundreds fit; the bound is the kernel's socket buffer, and the message says so
        assert "maxsize=0 is bounded by the kernel's socket buffer" in str(exc.value)
        assert "net.core.wmem_max" in str(exc.value) and "consumer" not in str(exc.value)
        assert [ch.get(key="k") for _ in range(n)] == list(range(n))
    finally:
        c.shutdown()


def test_a_worker_killed_while_writing_its_result_is_reported_as_its_death():
    c = Cluster(ClusterConfig(num_devices=2, timeout_s=20))
    try:
        group = DebugWorker.create_group(None).launch(c, ComponentPlacement({"d": "0"}, 2).get_strategy("d"),
                                                      name="Dying")
        pid = group.pids[0]
        with pytest.raises(WorkerDiedError, match=rf"Dying rank 0 \(pid {pid}\) died with signal SIGKILL"):
            group.die_while_returning().wait()
    finally:
        c.shutdown()


class _SlowToDie:
    """A rank's Process as seen by the driver on a loaded machine: it ignores SIGTERM and ends `dies_after_s` of join
    time after SIGKILL (never, if None), on a counted clock instead of a real one."""

    def __init__(self, pid: int, dies_after_s: float | None):
        self.pid, self.dies_after_s, self.killed, self.waited = pid, dies_after_s, False, 0.0

    def is_alive(self) -> bool:
        return not (self.killed and self.dies_after_s is not None and self.waited >= self.dies_after_s)

    def join(self, timeout: float) -> None:
        if self.killed:
            self.waited += timeout

    def terminate(self) -> None:
        pass

    def kill(self) -> None:
        self.killed = True


def test_a_rank_slow_to_die_after_sigkill_is_waited_for_and_one_that_never_dies_is_named(capsys):
    ranks = LocalRanks.__new__(LocalRanks)  # no processes: only finish_stop's escalation is under test
    ranks.name, ranks._lock, ranks._cmd, ranks._res = "EnvGroup", threading.Lock(), [], []
    ranks.procs = [_SlowToDie(101, 5.0), _SlowToDie(102, None)]
    ranks.finish_stop(time.monotonic())
    assert all(p.killed for p in ranks.procs)
    assert not ranks.procs[0].is_alive()  # 5 s to die after SIGKILL: waited for, not left for the caller to find
    err = capsys.readouterr().err
    assert f"EnvGroup rank 1 (pid 102) was still alive {KILL_WAIT_S:g} s after SIGKILL" in err
    assert "rank 0" not in err
