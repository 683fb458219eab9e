"""Asynchronous PPO (algorithm.loss_type: decoupled_actor_critic, rlinf_mini/runners/embodied_async.py): staleness 0
is the synchronous run bit for bit; staleness 1 queues batch i+1 before the actor trains batch i and stays within the
bound; checkpoints resume; the inline backend runs it (Ray: test_ray.py); a failing worker is named with its rank.

The module's runs are made once (`runs`) and read by the tests; order is proved by the runner's launch log, the
versions the trajectories carry and the trace's span order, never by durations.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import write_config

from rlinf_mini.config import ConfigError, load_config
from rlinf_mini.runners.base import find_latest_checkpoint
from rlinf_mini.train import RunPlan, run_to_the_end
from stages.train_async import RolloutStore
from stages.weight_buffer import WRITING, read_newest

ROOT = Path(__file__).resolve().parents[1]
ASYNC = {"loss_type": "decoupled_actor_critic"}
RUN = dict(  # configs/embodied_mlp.yaml's hybrid placement (actor data-parallel over both devices), made tiny
    runner={"max_epochs": 4, "val_check_interval": 2, "save_interval": 2, "progress_bar": False,
            "logger": {"logger_backends": []}},
    env={"train": {"total_num_envs": 16, "max_steps_per_rollout_epoch": 8},
         "eval": {"total_num_envs": 8, "max_steps_per_rollout_epoch": 8}},
    actor={"global_batch_size": 64, "micro_batch_size": 32},
)
pytestmark = pytest.mark.timeout(900)  # the module fixture's runs count against the first test's limit


def merged(base: dict, new: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in new.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def train(tmp_path: Path, name: str, steps: int = 4, resume: str | None = None, **sections):
    """One run through the entry's own launch (train.launch), returning the runner (its history, launch log,
    trace spans) after every process has stopped."""
    cfg_path = write_config(tmp_path, **merged(RUN, merged({"runner": {"logger": {"experiment_name": name}}},
                                                           sections)))
    argv = ["--config", str(cfg_path), "--runner.max-epochs", str(steps)]
    if resume:
        argv += ["--runner.resume-dir", resume]
    cfg = load_config(argv)
    return run_to_the_end(cfg, RunPlan(cfg, str(cfg_path)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("async")
    out = {
        "sync": train(tmp, "sync"),
        "s0": train(tmp, "s0", algorithm={**ASYNC, "staleness_threshold": 0}),
        "s0_no_wait": train(tmp, "s0_no_wait", algorithm={**ASYNC, "staleness_threshold": 0},
                            actor={"sync_weight_no_wait": True}),
        "s0_recompute": train(tmp, "s0_recompute", algorithm={**ASYNC, "staleness_threshold": 0},
                              rollout={"recompute_logprobs": True}),
        "s1": train(tmp, "s1", algorithm={**ASYNC, "staleness_threshold": 1}, runner={"trace": True}),
        "s1_no_save": train(tmp, "s1_no_save", algorithm={**ASYNC, "staleness_threshold": 1},
                            runner={"val_check_interval": -1, "save_interval": -1}),
        "s1_recompute": train(tmp, "s1_recompute", algorithm={**ASYNC, "staleness_threshold": 1},
                              rollout={"recompute_logprobs": True}),
        "s2_store2": train(tmp, "s2_store2", algorithm={**ASYNC, "staleness_threshold": 2,
                                                        "rollout_store_size_per_rank": 2}),
        "s0_inline": train(tmp, "s0_inline", algorithm={**ASYNC, "staleness_threshold": 0},
                           cluster={"backend": "inline"}),
        "s1_inline": train(tmp, "s1_inline", algorithm={**ASYNC, "staleness_threshold": 1},
                           cluster={"backend": "inline"}),
    }
    for name, s in (("s0", 0), ("s1", 1)):  # 2 steps, then a new run resumes from its checkpoint to step 4
        algo = {**ASYNC, "staleness_threshold": s}
        train(tmp, f"{name}_split", steps=2, algorithm=algo)
        out[f"{name}_resumed"] = train(tmp, f"{name}_split", resume="auto", algorithm=algo)
    return out


def train_lines(runner) -> list[dict]:
    return [h for h in runner.history if "train/critic/value_loss" in h]


def comparable(runner) -> list[dict]:
    """Every logged number but timings (and sync/*: bytes and seconds of the weight copy)."""
    return [{k: v for k, v in h.items() if not k.startswith(("time/", "sync/"))} for h in runner.history]


def assert_same_lines(a: list[dict], b: list[dict]) -> None:
    """Equal line by line, key by key (NaN equal to NaN: an eval that finished no episode logs a NaN return)."""
    assert [sorted(h) for h in a] == [sorted(h) for h in b]
    for ha, hb in zip(a, b, strict=True):
        for k in ha:
            assert ha[k] == hb[k] or (ha[k] != ha[k] and hb[k] != hb[k]), (ha["step"], k, ha[k], hb[k])


def final_weights(runner) -> dict:
    return torch.load(runner.run_dir / "checkpoints/global_step_4/actor/actor.pt", weights_only=True)


def assert_same_weights(a: dict, b: dict) -> None:
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for pa, pb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True):
        for k in pa:
            assert torch.equal(torch.as_tensor(pa[k]), torch.as_tensor(pb[k])), k


# --- staleness 0 is the synchronous schedule ------------------------------------------------------------------------


def test_staleness_0_reproduces_the_synchronous_run_bitwise(runs):
    assert_staleness_0_is_the_sync_run(runs["sync"], runs["s0"])


def assert_staleness_0_is_the_sync_run(sync, s0) -> None:
    """Every number both runs log is equal, and the final weights and optimizer state (test_ray.py's Ray run too)."""
    assert_same_weights(final_weights(sync), final_weights(s0))
    a, b = comparable(sync), comparable(s0)
    assert [h["step"] for h in a] == [h["step"] for h in b] == [0, 1, 2, 3, 4]  # eval at 0, then 4 steps
    shared = 0
    for ha, hb in zip(a, b, strict=True):
        for k in ha.keys() & hb.keys():
            assert ha[k] == hb[k] or (ha[k] != ha[k] and hb[k] != hb[k]), (ha["step"], k)  # NaN == NaN here
            shared += 1
    assert shared > 60
    # what differs is only the loss's diagnostics: the decoupled loss logs RLinf's names (w = 1 at staleness 0)
    lines = train_lines(s0)
    assert all(h["train/actor/behav_approx_kl"] == 0.0 and h["train/actor/behav_clip_fraction"] == 0.0
               for h in lines)
    assert [h["train/actor/current_version"] for h in lines] == [1.0, 2.0, 3.0, 4.0]
    assert [h["rollout/data_staleness_0/ratio"] for h in lines] == [1.0] * 4


def test_no_wait_publishing_makes_the_rollout_wait_for_the_stamp(runs):
    """actor.sync_weight_no_wait: the driver queues batch i without waiting for version i's copy; the rollout's
    read waits for the stamp itself (a read of the older version would change every number)."""
    assert [h["rollout/weight_version"] for h in train_lines(runs["s0_no_wait"])] == [0, 1, 2, 3]
    assert_same_weights(final_weights(runs["s0"]), final_weights(runs["s0_no_wait"]))
    assert_same_lines(comparable(runs["s0"]), comparable(runs["s0_no_wait"]))


def test_recomputed_anchor_at_staleness_0_is_the_behaviour_policy_up_to_rounding(runs):
    """rollout.recompute_logprobs: the actor's forward before the update gives the proximal log-probs. At staleness
    0 its weights are the rollout's, so pi_prox = pi_behav but for float rounding (the actor's batched forward and
    the rollout's sampling forward add up differently): w = 1 within 1e-5 and the run stays near the sync run."""
    lines, sync = train_lines(runs["s0_recompute"]), train_lines(runs["sync"])
    for h, g in zip(lines, sync, strict=True):
        assert abs(h["train/actor/behav_approx_kl"]) < 1e-5
        assert abs(h["train/actor/policy_loss"] - g["train/actor/policy_loss"]) < 1e-3
    assert all(h["rollout/data_staleness_0/ratio"] == 1.0 for h in lines)


def test_resume_at_staleness_0_continues_bitwise(runs):
    assert_same_weights(final_weights(runs["s0"]), final_weights(runs["s0_resumed"]))
    assert [h["step"] for h in runs["s0_resumed"].history] == [3, 4]
    assert_same_lines(comparable(runs["s0"])[3:], comparable(runs["s0_resumed"]))


def test_inline_backend_runs_it_and_staleness_0_matches_local_bitwise(runs):
    assert_same_weights(final_weights(runs["s0"]), final_weights(runs["s0_inline"]))
    assert_same_lines(comparable(runs["s0"]), comparable(runs["s0_inline"]))
    lines = train_lines(runs["s1_inline"])
    assert len(lines) == 4 and all(0 <= i - h["rollout/weight_version"] <= 1 for i, h in enumerate(lines))


# --- staleness 1: the next batch is produced while the actor trains --------------------------------------------------


@pytest.mark.parametrize("name", ["s1", "s1_recompute", "s1_inline"])
def test_batch_i_plus_1_is_queued_before_the_actor_trains_batch_i_except_across_a_checkpoint(runs, name):
    """(batch, actor version when queued): batch 1 goes at version 0, with batch 0; batch 2 waits for the checkpoint
    at step 2 (save_interval 2: a save is a barrier), then batches 2 and 3 go at version 2."""
    assert runs[name].launch_log == [(0, 0), (1, 0), (2, 2), (3, 2)]


def test_a_batch_queued_ahead_of_the_bound_waits_in_the_rollout_for_its_version(runs):
    """With no checkpoint barrier the driver queues batch i+2 while the actor holds version i (one ahead of the
    bound); the rollout's load holds it until version i+1 exists: batch 2, queued at version 0, was made by a
    version >= 1, batch 3, queued at version 1, by one >= 2."""
    runner = runs["s1_no_save"]
    assert runner.launch_log == [(0, 0), (1, 0), (2, 0), (3, 1)]
    loaded = [h["rollout/weight_version"] for h in train_lines(runner)]
    assert all(loaded[b] >= queued_at + 1 for b, queued_at in runner.launch_log[2:])
    assert_within_staleness_1(runner)


@pytest.mark.parametrize("name", ["s1", "s1_recompute", "s1_inline", "s1_resumed", "s1_no_save"])
def test_the_rollout_is_never_more_than_the_threshold_ahead(runs, name):
    """Every sample of the batch trained at step i was made by a version in [i - 1, i]: from the versions the
    rollout loaded and the trajectories' per-sample versions (data_staleness_k: the share k versions behind)."""
    assert_within_staleness_1(runs[name], first=runs[name].history[0]["step"] - 1 if name.endswith("resumed") else 0)


def assert_within_staleness_1(runner, first: int = 0) -> None:
    """The batch trained at step i (first, first + 1, ...) was made by versions in [i - 1, i] (test_ray.py too)."""
    for i, h in enumerate(train_lines(runner), start=first):
        assert i - 1 <= h["rollout/weight_version"] <= i
        ratios = {k: v for k, v in h.items() if k.startswith("rollout/data_staleness_")}
        assert set(ratios) <= {"rollout/data_staleness_0/ratio", "rollout/data_staleness_1/ratio"}
        assert abs(sum(ratios.values()) - 1) < 1e-9
        assert i - 1 <= h["train/actor/average_version"] <= i
        assert h["rollout/discarded_unused_trajs"] == 0.0  # batches arrive in order: none is dropped unused


def test_a_store_of_two_trains_on_the_freshest_batches_within_the_bound(runs):
    """rollout_store_size_per_rank 2 with staleness 2: the first update reads the one batch there is, later ones up
    to two, never a sample more than 2 versions behind (the store drops the older batch once it is)."""
    lines = train_lines(runs["s2_store2"])
    sizes = [h["rollout/store_size"] for h in lines]
    assert sizes[0] == 1 and set(sizes) <= {1.0, 2.0} and len(lines) == 4
    for h in lines:
        ratios = {k: v for k, v in h.items() if k.startswith("rollout/data_staleness_")}
        assert all(0 <= int(k.split("_")[-1].split("/")[0]) <= 2 for k in ratios)
        assert abs(sum(ratios.values()) - 1) < 1e-9
        assert h["rollout/discarded_unused_trajs"] == 0.0


def test_staleness_1_trains_on_stale_data_with_the_interpolated_anchor(runs):
    """Batch 1 is read at version 0 by construction (queued before version 1 exists; the rollout reads it right
    after batch 0), and batch 3 likewise from version 2: stale samples, so the behaviour weight moves off 1."""
    lines = train_lines(runs["s1"])
    stale = [i for i, h in enumerate(lines) if h.get("rollout/data_staleness_1/ratio", 0) > 0]
    assert stale, [h["rollout/weight_version"] for h in lines]
    assert all(lines[i]["train/actor/behav_approx_kl"] != 0.0 for i in stale)


def test_the_trace_shows_the_rollout_generating_while_the_actor_trains(runs):
    """The spans (component, rank, name, stage, start, end) of the s1 run: some rollout `generate` call starts before
    an actor `run_training` call ends and ends after it starts (the two overlap on the shared clock)."""
    spans = runs["s1"].trace_spans
    generate = [s for s in spans if s[0] == "RolloutGroup" and s[2] == "generate"]
    training = [s for s in spans if s[0] == "ActorGroup" and s[2] == "run_training"]
    assert len(generate) == 4 and len(training) == 8  # 4 batches; 4 updates on each of 2 actor ranks
    assert any(g[4] < t[5] and t[4] < g[5] for g in generate for t in training)


def test_resume_at_staleness_1_continues_from_the_checkpoint(runs):
    resumed = runs["s1_resumed"]
    assert [h["step"] for h in resumed.history] == [3, 4]
    assert resumed.launch_log == [(2, 2), (3, 2)]
    assert find_latest_checkpoint(resumed.run_dir).name == "global_step_4"


# --- a failing worker ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault, says", [
    ("group=EnvGroup,rank=0,method=interact,call=2,kind=raise", "EnvGroup rank 0 raised in interact()"),
    ("group=RolloutGroup,rank=0,method=load_newest_weights,call=2,kind=kill9", "RolloutGroup rank 0 (pid"),
    ("group=ActorGroup,rank=1,method=run_training,call=1,kind=raise", "ActorGroup rank 1 raised in run_training()"),
])
def test_a_failing_worker_is_reported_by_group_and_rank(tmp_path, fault, says):
    cfg = write_config(tmp_path, **merged(RUN, {"algorithm": {**ASYNC, "staleness_threshold": 1},
                                                "runner": {"val_check_interval": -1, "save_interval": -1},
                                                "cluster": {"timeout_s": 60}}))
    env = {**os.environ, "RLINF_MINI_FAULT": fault, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "rlinf_mini.train", "--config", str(cfg)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)  # a hang guard, not a measurement
    assert done.returncode == 1, done.stderr[-2000:]
    assert says in done.stderr, done.stderr[-2000:]


def test_ctrl_c_stops_the_async_run_and_leaves_nothing_behind(tmp_path):
    """SIGINT once the first checkpoint exists (batches are in flight then: staleness 1): exit 130, the stop line,
    and no shared-memory segment of the run left."""
    from rlinf_mini.scheduler.shm import PREFIX, SHM_DIR

    cfg = write_config(tmp_path, **merged(RUN, {"algorithm": {**ASYNC, "staleness_threshold": 1},
                                                "runner": {"max_epochs": 1000, "val_check_interval": -1,
                                                           "save_interval": 3}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RLINF_MINI_FAULT", None)
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "rlinf_mini.train", "--config", str(cfg)], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
        try:
            run_dir = tmp_path / "results/embodied"
            for _ in range(2400):  # a hang guard (240 s): the event waited for is the first checkpoint folder
                if proc.poll() is not None or (run_dir / "checkpoints").is_dir() and find_latest_checkpoint(run_dir):
                    break
                time.sleep(0.1)
            assert proc.poll() is None, Path(err.name).read_text()[-2000:]
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stderr = Path(err.name).read_text()
    assert code == 130, stderr[-2000:]
    assert "interrupted: all workers stopped (SIGINT)" in stderr
    assert not [n for n in os.listdir(SHM_DIR) if n.startswith(f"{PREFIX}{proc.pid}")]


# --- the pieces, on their own ----------------------------------------------------------------------------------------


def batch_of(*versions: int) -> dict:
    return {"versions": torch.tensor([list(versions)])}  # [T = 1, B]


def test_rollout_store_keeps_the_freshest_and_counts_what_no_update_read():
    store = RolloutStore(maxsize=2)
    a, b, c = batch_of(0, 0), batch_of(0, 1), batch_of(1, 1)
    store.add(a)
    store.add(b)
    assert store.topn(2) == [b, a]  # freshest first: by oldest version, then mean version
    store.add(c)  # full: the stalest (a, read by an update) leaves
    assert store.topn(1) == [c] and store.discarded_unused == 0
    store.add(batch_of(0, 0))  # staler than all: evicted at once, never read
    assert store.discarded_unused == 1 and len(store) == 2
    store.remove_below(1)  # b's oldest sample is version 0: dropped; b was read
    assert store.topn(2) == [c] and store.discarded_unused == 1
    store.add(batch_of(2, 2))
    store.add(batch_of(3, 3))  # c leaves, read; the version-2 batch stays
    store.remove_below(3)  # the version-2 batch leaves unread
    assert store.discarded_unused == 2 and len(store) == 1


def test_recomputing_gives_the_proximal_log_probs_and_values_of_a_plain_forward_per_step():
    """compute_proximal_logprobs against a loop over the batch's steps with the actor's policy: log-probs [T, B] and
    values[:T] (RLinf's proximal_values) are the current weights'; values[T] and the stored item stay the rollout's."""
    from rlinf_mini.models.mlp_policy import MLPPolicy
    from stages.train_async import AsyncActorWorker

    T, B, C, A, obs_dim = 5, 6, 2, 3, 7
    torch.manual_seed(0)
    worker = AsyncActorWorker.__new__(AsyncActorWorker)  # the method's inputs only: no process, no channel
    worker.cfg = load_config(["--config", str(ROOT / "configs/embodied_mlp.yaml"), "--actor.micro-batch-size", "4"])
    worker.device = torch.device("cpu")
    worker.policy = MLPPolicy(obs_dim, A, discrete=False, num_action_chunks=C, hidden_dim=16)
    behaviour_values = torch.randn(T + 1, B)
    stored = {"obs": torch.randn(T, B, obs_dim), "actions": torch.randn(T, B, C, A), "logprobs": torch.randn(T, B),
              "values": behaviour_values, "rewards": torch.randn(T, B),
              "dones": torch.zeros(T + 1, B, dtype=torch.bool), "versions": torch.zeros(T, B)}
    worker.batch = dict(stored)
    worker.compute_proximal_logprobs()
    with torch.no_grad():
        expected = [worker.policy.default_forward(stored["obs"][t], stored["actions"][t]) for t in range(T)]
    torch.testing.assert_close(worker.batch["proximal_logprobs"], torch.stack([e["logprobs"] for e in expected]))
    torch.testing.assert_close(worker.batch["values"][:T], torch.stack([e["values"] for e in expected]))
    assert torch.equal(worker.batch["values"][T], behaviour_values[T])
    assert stored["values"] is behaviour_values and not torch.equal(worker.batch["values"][:T], behaviour_values[:T])


def test_read_newest_redoes_a_copy_the_actor_wrote_into():
    """The seqlock: a copy during which the stamp moved (the actor started writing version 4) is redone, and the
    version returned is the one whose bytes were copied."""
    stamp = torch.tensor([3], dtype=torch.int64)
    buffer, copies = torch.zeros(2), []

    def copy_out():
        copies.append(buffer.clone())
        if len(copies) == 1:  # the actor writes during the first copy: WRITING, the bytes, then the stamp
            stamp.fill_(WRITING)
            buffer.fill_(4.0)
            stamp.fill_(4)

    assert read_newest(stamp, copy_out, min_version=3, timeout=10.0) == 4
    assert len(copies) == 2 and torch.equal(copies[-1], torch.full((2,), 4.0))


def test_read_newest_waits_for_the_bound_and_times_out_naming_it():
    stamp = torch.tensor([WRITING], dtype=torch.int64)
    with pytest.raises(TimeoutError, match=r"version >= 2 did not arrive .* holds version -2"):
        read_newest(stamp, lambda: None, min_version=2, timeout=0.05)


@pytest.mark.parametrize("algo, runner, key", [
    ({}, {}, "algorithm.staleness_threshold"),
    ({"staleness_threshold": -1}, {}, "algorithm.staleness_threshold"),
    ({"staleness_threshold": 1, "on_policy_min_ratio": 0.5}, {}, "algorithm.on_policy_min_ratio"),
    ({"staleness_threshold": 1}, {"weight_sync_interval": 2}, "runner.weight_sync_interval"),
])
def test_async_config_errors_name_the_key_in_one_line(tmp_path, algo, runner, key):
    cfg_path = write_config(tmp_path, algorithm={**ASYNC, **algo}, runner=runner)
    with pytest.raises(ConfigError) as err:  # load_config runs every check (validate_config)
        load_config(["--config", str(cfg_path)])
    assert f": {key}: " in str(err.value) and "\n" not in str(err.value)


def test_explain_names_who_waits_for_whom_and_the_bound(capsys):
    from rlinf_mini.explain import main

    assert main(["--config", "configs/embodied_mlp.yaml", "--algorithm.loss-type", "decoupled_actor_critic",
                 "--algorithm.staleness-threshold", "1"]) == 0
    out = capsys.readouterr().out
    assert "asynchronous PPO" in out and "staleness_threshold 1" in out
    assert "batch i starts once i <= actor version + 1" in out


def test_the_benchmark_s_runs_going_on_at_once_get_disjoint_cores():
    from benchmarks.async_ppo import core_sets

    assert core_sets([0, 2, 4, 6, 8, 10], 3, 2) == [[0, 2], [4, 6], [8, 10]]  # the process's own cores, in order
    assert core_sets([0, 1], 2, 0) == [[0, 1], [0, 1]]  # no pinning: they share
    with pytest.raises(SystemExit, match="--parallel 3 x --cores-per-run 4 needs 12 cores; this process may use 8$"):
        core_sets(list(range(8)), 3, 4)
