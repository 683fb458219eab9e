# %% [markdown]
# # 02 — Weight sync: the actor's new weights reach every rollout rank
#
# Run it: `python tutorials/02_weight_sync.py` (about 7 s on a 2-core CPU; it starts five worker
# processes). Every stated fact is an `assert` in the cell after it. Terms (version, staleness, training step,
# optimizer step, ...): [the glossary](glossary.md).
#
# ## What this stage does, and why RLinf has it
#
# The actor trains one copy of the policy; the rollout infers with another, in other processes (often on other
# GPUs). At the start of each step the actor's weights must reach every rollout rank, or the rollout would keep
# acting with an old policy and PPO's importance ratios would drift. RLinf does this in
# `EmbodiedRunner.update_rollout_weights`: actor rank 0 sends (data-parallel ranks hold identical weights), every
# rollout rank receives, and the rollout tags every action with the **version** of the weights that produced it.
#
# Here, on one machine, each rollout rank allocates one shared-memory buffer at start-up; actor rank 0 copies its
# tensors straight into every buffer and then writes a version stamp. On the CPU the rollout's parameters *are*
# views of that buffer, so the copy is all there is.
#
# ## The code to read
#
# - `stages/sync.py`: `plan_layout` (the buffer's layout), `WeightReceiver.__init__` (allocate once, bind the
#   parameters), `WeightSender.send` (data first, stamp last), `WeightReceiver.wait_for_version`.
# - `stages/train.py::ActorWorker.sync_model_to_rollout`, `stages/rollout.py::RolloutWorker.sync_model_from_actor`,
#   `rlinf_mini/runners/base.py::Runner.update_rollout_weights` (starts both sides, waits for both).

# %%
import torch
from workbench import OUT, ROOT

from rlinf_mini.models import MLPPolicy
from stages.sync import WeightReceiver, WeightSender

# %% [markdown]
# ## Run it (1): sender and receiver in this process
#
# Two policies with different random weights: the actor's and the rollout's.

# %%
torch.manual_seed(0)
actor_model = MLPPolicy(obs_dim=4, action_dim=2, discrete=False, hidden_dim=64)
torch.manual_seed(1)
rollout_model = MLPPolicy(obs_dim=4, action_dim=2, discrete=False, hidden_dim=64)
receiver = WeightReceiver(rollout_model)  # the rollout, once: allocate the buffer, bind its parameters to it
sender = WeightSender()
try:
    before = {k: v.clone() for k, v in rollout_model.state_dict().items()}
    assert not all(torch.equal(before[k], v) for k, v in actor_model.state_dict().items())
    nbytes = sender.send(actor_model, [receiver.handle()], version=1)
    # the rollout has not looked yet, but its parameters already hold the actor's: they are views of the buffer
    same_now = all(torch.equal(rollout_model.state_dict()[k], v) for k, v in actor_model.state_dict().items())
    waited = receiver.wait_for_version(1, timeout=5.0)
    after = {k: v.clone() for k, v in rollout_model.state_dict().items()}  # copied out: the buffer goes below
    # a version that was never stamped is a timeout, not a silent read of old weights
    try:
        receiver.wait_for_version(2, timeout=0.05)
        timed_out = False
    except TimeoutError as e:
        timed_out = True
        print(f"as expected, a version nobody sent times out: TimeoutError: {e}")
finally:
    sender.close()
    receiver.close()  # unmaps the buffer: the rollout model's parameters are gone with it
    del rollout_model
n_params = sum(v.numel() * v.element_size() for v in actor_model.state_dict().values())
print(f"sent {nbytes} bytes ({n_params} bytes of tensors); rollout version {receiver.version}, waited {waited:.6f} s")

# %% [markdown]
# ## What you should see (1)
#
# After the sync the rollout's weights equal the actor's **bitwise** (`torch.equal`, not `allclose`), already
# before `wait_for_version` looked (zero copy on the CPU); the bytes sent are exactly the bytes of the state dict;
# the receiver holds version 1; waiting for version 2, which nobody sent, raises `TimeoutError`.

# %%
assert same_now
assert all(torch.equal(after[k], v) for k, v in actor_model.state_dict().items())
assert nbytes == n_params
assert receiver.version == 1 and timed_out

# %% [markdown]
# ## Run it (2): a real worker group, versions and staleness
#
# The MLP config, placed so that there are 2 env ranks, 2 rollout ranks and 1 actor rank, each a process, with
# `runner.weight_sync_interval: 2`: the runner syncs only at the start of every second training step. We make the
# runner's own calls, one at a time: sync (version 0, the initial weights), two training steps
# (`runner.train_step()`: sync if due → `generate_rollouts` → advantages → training), then the sync the third step
# would start with.
#
# **Where the version number comes from**: `EmbodiedRunner.update_rollout_weights` sends the weights with
# `version = global_step`, the number of *training steps* done so far, not the number of optimizer steps: one
# training step holds `update_epoch` × (samples / `global_batch_size`) optimizer steps. The rollout stamps every
# action it produces with the version it holds, and the actor logs **`rollout/staleness`** = its own `global_step`
# (the training step it is on) minus the mean version of the step's trajectories: how many training steps old the
# weights that collected the data are. 0 means the data came from the very weights about to be trained.

# %%
import shutil
import time

from rlinf_mini.config import load_config
from rlinf_mini.scheduler.cluster import Cluster
from rlinf_mini.train import RunPlan, launch

shutil.rmtree(OUT / "runs" / "02_weight_sync", ignore_errors=True)  # a run folder holds one run: start afresh
argv = ["--config", str(ROOT / "configs/embodied_mlp.yaml"), "--runner.no-progress-bar",
        "--runner.logger.log-path", str(OUT / "runs"), "--runner.logger.experiment-name", "02_weight_sync",
        "--cluster.component-placement.env", "0-1", "--cluster.component-placement.rollout", "0-1",
        "--cluster.component-placement.actor", "0", "--runner.weight-sync-interval", "2",
        "--env.train.total-num-envs", "16", "--env.train.max-steps-per-rollout-epoch", "8",
        "--actor.global-batch-size", "64", "--actor.micro-batch-size", "32"]
cfg = load_config(argv)
plan = RunPlan(cfg, "02_weight_sync")
cluster = Cluster(cfg.cluster)
try:
    start = time.perf_counter()
    runner = launch(cfg, plan, cluster)
    runner.init_workers()
    startup_s = time.perf_counter() - start

    def weights():
        actor = runner.actor.execute_on(0).get_state_dict().wait()[0]
        return actor, runner.rollout.get_state_dict().wait()  # one state dict per rollout rank

    def trajectory_versions():
        return torch.cat([b["versions"].flatten() for b in runner.actor.get_rollout_batch().wait()])

    start = time.perf_counter()
    sync0 = runner.update_rollout_weights()  # version 0: the initial weights
    actor_w0, rollout_w0 = weights()
    step1 = runner.train_step()  # global_step 0: its sync is due, but the rollout already holds version 0
    versions1 = trajectory_versions()
    actor_w1, rollout_after1 = weights()
    step2 = runner.train_step()  # global_step 1: 1 % 2 != 0, no sync; the rollout acts with version 0 again
    versions2 = trajectory_versions()
    sync2 = runner.update_rollout_weights()  # global_step 2: version 2, what step 3 would start with
    actor_w2, rollout_w2 = weights()
    work_s = time.perf_counter() - start
    actor_spans = [s for per_rank in runner.actor.trace_drain().wait() for s in per_rank]  # runner.trace is on
finally:
    cluster.shutdown()
optimizer_steps = sum(s[2] == "optimizer_step" for s in actor_spans)
print(f"staleness: step 1 {step1['rollout/staleness']:g}, step 2 {step2['rollout/staleness']:g}; rollout version "
      f"{runner.rollout_version} after {runner.global_step} training steps = {optimizer_steps} optimizer steps")
print({k: f"{v:.3g}" for k, v in sync2.items()})
print(f"starting the processes: {startup_s:.1f} s; the syncs and two steps: {work_s:.2f} s")

# %% [markdown]
# ## What you should see (2)
#
# - After each sync, **every** rollout rank's weights equal actor rank 0's bitwise.
# - Every sample of step 1's trajectories carries version 0, the weights it was produced with: staleness 0.
# - Training changes the actor's weights; until the next sync the rollout still holds version 0's. So step 2 (no
#   sync: `weight_sync_interval` 2) collects its data with version 0 while the actor is on training step 1:
#   **staleness 1**.
# - The sync after two training steps sends version 2, although the actor has made 16 optimizer steps by then
#   (`update_epoch` 4 × 128 samples / `global_batch_size` 64 = 8 per training step).
# - `sync/bytes` is the size of the state dict times the 2 rollout ranks it was written to; `sync/GBps` is
#   `sync/bytes / sync/seconds`, which for a 36 KB model measures call overhead more than bandwidth (`benchmarks/`
#   measures transfers properly).
# - Starting the five processes took longer than the syncs and the two training steps together.

# %%
def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


assert len(rollout_w0) == 2 and all(equal(actor_w0, w) for w in rollout_w0)
assert (versions1 == 0).all() and step1["rollout/staleness"] == 0
assert not equal(actor_w1, actor_w0) and all(equal(actor_w0, w) for w in rollout_after1)
assert (versions2 == 0).all() and step2["rollout/staleness"] == 1 and "sync/bytes" not in step2
assert all(equal(actor_w2, w) for w in rollout_w2) and runner.rollout_version == runner.global_step == 2
assert optimizer_steps == 16 == 2 * cfg.algorithm.update_epoch * (16 * 8 // cfg.actor.global_batch_size)
assert sync2["sync/bytes"] == 2 * sum(v.numel() * v.element_size() for v in actor_w2.values())
assert abs(sync2["sync/GBps"] - sync2["sync/bytes"] / sync2["sync/seconds"] / 1e9) < 1e-6 * sync2["sync/GBps"]
assert startup_s > work_s

# %% [markdown]
# ## Run it (3): the default, `weight_sync_interval: 1`
#
# The same config with the default interval, three steps, on the **inline backend** (`--cluster.backend inline`:
# every rank is a thread of this process, so there are no processes to start and it takes a second or two; the same
# config and seed give the same run on every backend). The runner syncs at the start of every step, so every step
# trains on data from the weights it is updating.

# %%
from rlinf_mini.train import build_and_run

shutil.rmtree(OUT / "runs" / "02_default", ignore_errors=True)  # a run folder holds one run: start afresh
default_cfg = load_config([*[a for a in argv if a not in ("--runner.weight-sync-interval", "2")],
                           "--cluster.backend", "inline", "--runner.max-epochs", "3", "--runner.val-check-interval",
                           "-1", "--runner.save-interval", "-1", "--runner.logger.logger-backends", "--runner.no-trace",
                           "--runner.logger.log-path", str(OUT / "runs"),
                           "--runner.logger.experiment-name", "02_default"])
default_history = build_and_run(default_cfg, RunPlan(default_cfg, "02_default"))
print("staleness per step:", [h["rollout/staleness"] for h in default_history])

# %% [markdown]
# ## What you should see (3)
#
# `weight_sync_interval` is 1 by default, and every step's staleness is 0.

# %%
assert load_config(["--config", str(ROOT / "configs/embodied_mlp.yaml")]).runner.weight_sync_interval == 1
assert default_cfg.runner.weight_sync_interval == 1
assert [h["rollout/staleness"] for h in default_history] == [0.0, 0.0, 0.0]

# %% [markdown]
# ## The RLinf counterpart
#
# - `rlinf/runners/embodied_runner.py::EmbodiedRunner.update_rollout_weights`: calls
#   `rollout.sync_model_from_actor()` and `actor.sync_model_to_rollout()` together and waits on both; it runs every
#   `runner.weight_sync_interval` steps.
# - `rlinf/workers/actor/embodied_fsdp_actor_worker.py::EmbodiedFSDPActor.sync_model_to_rollout`: only actor rank 0
#   sends, by a broadcast to all rollout ranks.
# - `rlinf/hybrid_engines/weight_syncer/`: `BucketWeightSyncer` (the state dict in buckets of ~512 MB) and
#   `PatchWeightSyncer` (sparse deltas against the last sent weights), over NCCL, or CUDA IPC on the same GPU.
#   The rollout records `self.version` and tags every `PolicyOutput` with `versions`, as here.
# - Left out here: buckets and patches (one machine, one shared buffer needs neither), NCCL across machines.
#
# ## Exercise
#
# The buffer layout. Each tensor of the state dict gets an offset in the shared segment: after a 64-byte header
# (the version stamp lives there), each tensor starts at a multiple of 64 bytes, in state-dict order, right after
# the previous one. Write `my_offsets(state)` returning the list of offsets, replacing the body.

# %%
import torch
from workbench import check_exercise, matches

from rlinf_mini.models import MLPPolicy
from stages.sync import plan_layout


def reference_offsets(state: dict) -> list[int]:
    return [slot.offset for slot in plan_layout(state)[0]]


def my_offsets(state: dict) -> list[int]:
    # EXERCISE: compute the offsets yourself (hint: t.numel() * t.element_size() bytes per tensor).
    return reference_offsets(state)


CASES = {"the MLP policy": (MLPPolicy(obs_dim=4, action_dim=2, discrete=False, hidden_dim=64).state_dict(),),
         "three dtypes": ({"a": torch.zeros(3), "b": torch.zeros(5, dtype=torch.float64),
                           "c": torch.zeros(16, dtype=torch.int8)},),
         "a scalar last": ({"w": torch.zeros(1000, 7), "b": torch.zeros(7),
                            "step": torch.zeros((), dtype=torch.int64)},),
         "sizes that are multiples of 64": ({"x": torch.zeros(16), "y": torch.zeros(32), "z": torch.zeros(1)},)}
check_exercise(my_offsets, reference_offsets, CASES)
unaligned = lambda state: [64 + sum(t.numel() * t.element_size() for t in list(state.values())[:i])  # noqa: E731
                           for i in range(len(state))]
assert not matches(unaligned, reference_offsets, CASES)  # a wrong answer (no alignment) fails
