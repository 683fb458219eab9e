# %% [markdown]
# # 01 — Placement: which device runs which rank
#
# Run it: `python tutorials/01_placement.py` (about 6 s on a 2-core CPU; it starts no process). Every stated fact
# is an `assert` in the cell after it. Terms (placement, rank, stage, ...): [the glossary](glossary.md).
#
# ## What this stage does, and why RLinf has it
#
# Before anything starts, the config's `cluster.component_placement` says, for each component (env, rollout,
# actor), which devices its processes run on. One string per key, in RLinf's grammar: `0-3` is four processes on
# devices 0..3, `all` is one per device, `0-3:0-7` is eight processes two per device, `0-3:0-1` is two processes
# owning two devices each. A key may name several components (`"env,rollout,actor": all`): each gets its own
# worker group, on the same devices.
#
# RLinf has it because the best layout depends on the hardware and the task, and changing it should be a config
# edit, not a code change: **collocated** (every component on every device, taking turns), **disaggregated** (each
# on its own devices, running at the same time and overlapping through pipelining), or **hybrid** (a mix: in
# RLinf's flagship embodied configs env and rollout run on separate GPUs, pipelined, and the actor trains on all).
#
# ## The code to read
#
# - `stages/placement.py`: `_parse_placement` (one string → the devices of each process),
#   `ComponentPlacement.__init__` (every key), `_classify` (the mode), `describe` (the map printed below),
#   `HybridComponentPlacement` (the embodied one: exactly env, rollout and actor).
# - `rlinf_mini/scheduler/cluster.py::Cluster.device_cores` and `allocate`: a device is a GPU
#   (`CUDA_VISIBLE_DEVICES=d` is set before torch loads in the process) or, without a GPU, a share of the CPU cores.

# %%
import multiprocessing

from workbench import OUT, ROOT

from stages.placement import ComponentPlacement, HybridComponentPlacement, PlacementMode

# %% [markdown]
# ## Run it
#
# The three modes, on four devices:

# %%
LAYOUTS = {
    "collocated": {"env,rollout,actor": "all"},
    "disaggregated": {"env": "0", "rollout": "1", "actor": "2-3"},
    "hybrid": {"env": "0-1", "rollout": "2-3", "actor": "all"},
}
placements = {name: HybridComponentPlacement(layout, num_devices=4) for name, layout in LAYOUTS.items()}
for name, placement in placements.items():
    print(f"--- {name}: {LAYOUTS[name]}\n{placement.describe()}")

# %% [markdown]
# ## What you should see
#
# - Collocated: every device runs one rank of each component (4 env, 4 rollout, 4 actor ranks: rank d on
#   device d); the mode is collocated.
# - Disaggregated: no device holds two components; the actor has 2 ranks on devices 2 and 3.
# - Hybrid: env ranks on devices 0-1, rollout ranks on 2-3, and actor rank d on device d for every device.

# %%
assert placements["collocated"].placement_mode == PlacementMode.COLLOCATED
assert all(placements["collocated"].get_world_size(c) == 4 for c in ("env", "rollout", "actor"))
assert all([p.devices for p in placements["collocated"].get_strategy(c).placements] == [(0,), (1,), (2,), (3,)]
           for c in ("env", "rollout", "actor"))
assert placements["disaggregated"].placement_mode == PlacementMode.DISAGGREGATED
assert placements["disaggregated"].get_hardware_ranks("actor") == [2, 3]
used = [set(placements["disaggregated"].get_hardware_ranks(c)) for c in ("env", "rollout", "actor")]
assert all(not (a & b) for i, a in enumerate(used) for b in used[i + 1:])  # no device holds two components
assert placements["hybrid"].placement_mode == PlacementMode.HYBRID
hybrid = placements["hybrid"]
assert [p.devices for p in hybrid.get_strategy("env").placements] == [(0,), (1,)]
assert [p.devices for p in hybrid.get_strategy("rollout").placements] == [(2,), (3,)]
assert [p.devices for p in hybrid.get_strategy("actor").placements] == [(0,), (1,), (2,), (3,)]

# %% [markdown]
# The `devices:processes` form. `0-3:0-7` puts 8 processes on 4 devices, consecutive ranks sharing a device;
# `0-3:0-1` gives 2 processes 2 devices each (for a model too big for one device).

# %%
two_per_device = ComponentPlacement({"rollout": "0-3:0-7"}, num_devices=4).get_strategy("rollout")
assert [p.devices for p in two_per_device.placements] == [(0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,)]
two_devices_each = ComponentPlacement({"actor": "0-3:0-1"}, num_devices=4).get_strategy("actor")
assert [p.devices for p in two_devices_each.placements] == [(0, 1), (2, 3)]

# %% [markdown]
# ### The placement map, as a picture
#
# Devices across, components down; each cell lists the ranks of that component on that device.

# %%
import matplotlib.pyplot as plt  # without a display (a script on a server, CI) matplotlib draws into files only

COMPONENTS = ["env", "rollout", "actor"]
COLORS = {"env": "#8fbc8f", "rollout": "#87ceeb", "actor": "#f4a460"}
fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
for ax, (name, placement) in zip(axes, placements.items(), strict=True):
    for row, component in enumerate(COMPONENTS):
        for device in range(placement.num_devices):
            ranks = [p.rank for p in placement.get_strategy(component).placements if device in p.devices]
            color = COLORS[component] if ranks else "#f0f0f0"
            ax.add_patch(plt.Rectangle((device, row), 0.95, 0.9, color=color))
            if ranks:
                ax.text(device + 0.47, row + 0.45, ",".join(f"{component}[{r}]" for r in ranks),
                        ha="center", va="center", fontsize=8)
    ax.set_xlim(0, placement.num_devices)
    ax.set_ylim(len(COMPONENTS), 0)
    ax.set_xticks([d + 0.47 for d in range(placement.num_devices)], [f"device {d}" for d in range(4)])
    ax.set_yticks([r + 0.45 for r in range(len(COMPONENTS))], COMPONENTS)
    ax.set_title(f"{name}: " + ", ".join(f"{k}: {v}" for k, v in LAYOUTS[name].items()), fontsize=10)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
fig.tight_layout()
picture = OUT / "01_placement.png"
fig.savefig(picture, dpi=100)  # a notebook also shows the figure under this cell
print(f"wrote {picture}")
assert picture.stat().st_size > 10_000

# %% [markdown]
# ### The plan of a real config: `--explain`
#
# `python -m rlinf_mini.train --config configs/embodied_mlp.yaml --explain` prints the plan of a run without
# starting anything: the placement map, the env ranks each rollout rank serves, the envs of every env rank and
# pipeline stage, and the batch arithmetic (tutorial 05). Here the same function is called in this process:

# %%
import contextlib
import io

from rlinf_mini.train import main


def explain(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--config", str(ROOT / "configs/embodied_mlp.yaml"), *args, "--explain"])
    return code, out.getvalue()


code, plan = explain()
print(plan)
assert code == 0
assert "  device 0: actor[0] env[0]\n  device 1: actor[1] rollout[0]\n  mode: hybrid" in plan
assert "rollout rank 0 serves env rank(s) 0" in plan

# %% [markdown]
# A placement whose arithmetic cannot work: two env ranks cannot be served by three rollout ranks (each rollout
# rank serves a whole block of env ranks, so the env ranks must be a multiple of the rollout ranks). `--explain`
# names the rule and the numbers that break it, and settings near it that pass every check; the run itself stops
# with the same one-line error and exit code 2, before any process starts.

# %%
BAD = ["--cluster.num-devices", "3", "--cluster.component-placement.env", "0-1",
       "--cluster.component-placement.rollout", "0-2"]
code, plan = explain(*BAD)
print(plan[plan.index("breaks"):])
assert code == 2 and "env ranks (2) must be a multiple of rollout ranks (3)" in plan
fixes = plan.split("pass every check:\n")[1].split("\n")
assert fixes[0].strip() == "--cluster.component-placement.rollout 0"
for fix in fixes[:2]:
    assert explain("--cluster.num-devices", "3", "--cluster.component-placement.env", "0-1", *fix.split())[0] == 0
err = io.StringIO()
with contextlib.redirect_stderr(err):  # the run itself, without --explain
    run_code = main(["--config", str(ROOT / "configs/embodied_mlp.yaml"), *BAD])
print(err.getvalue())
assert run_code == 2 and len(err.getvalue().strip().splitlines()) == 1
assert "env ranks (2) must be a multiple of rollout ranks (3)" in err.getvalue()
assert not multiprocessing.active_children()  # this tutorial started no process

# %% [markdown]
# ### Which layout is fastest here: the autotune
#
# `python -m rlinf_mini.autotune --config configs/embodied_mlp.yaml` answers it for this machine: it times the env's
# chunk step against the sub-envs per call, the policy's inference against the batch and the actor's update
# (`rlinf_mini/autotune/profile.py`, short real runs), fits each as a line, predicts every layout RLinf's search
# builds (collocated; env | rollout split with the actor on all devices; 1..4 pipeline stages) with the pipeline
# formula of `rlinf_mini/autotune/model.py`, and prints them ranked, with the refused ones and why. Profiling takes
# a minute and depends on the load, so here the costs are given as RLinf's `profile_data` (numbers from a run of the
# profiler on a 2-core CPU with the env waiting 4 ms a step): nothing is timed and no process starts.

# %%
from rlinf_mini.autotune.__main__ import autotune, table, write_overlay
from rlinf_mini.config import load_config

PROFILE = ["profile_data.env_profile_data={4: 0.00437, 8: 0.00443, 16: 0.00487, 32: 0.00445}",
           "profile_data.rollout_profile_data={4: 0.00066, 8: 0.00066, 16: 0.00066, 32: 0.00067}",
           "profile_data.actor_profile_data={512: 0.075}", "profile_data.hop_s=0.0015", "profile_data.fixed_s=0.005"]
MLP = str(ROOT / "configs/embodied_mlp.yaml")
result = autotune(load_config(["--config", MLP, *PROFILE]), "configs/embodied_mlp.yaml", progress=False)
print(table(result))
ranked = [row for row in result.rows if not row.refusal]
assert [r.prediction.step_s for r in ranked] == sorted(r.prediction.step_s for r in ranked)  # ranked by prediction
assert all("refused: " in row.refusal for row in result.rows[len(ranked):])  # each refusal says why
assert result.best.layout.stages == 1 and result.current.layout.stages == 2  # the claim of the next cell
assert result.current.prediction.step_s > result.best.prediction.step_s

# %% [markdown]
# The env's 4 ms is a wait per call, whatever the number of sub-envs: cutting the envs into stages multiplies the
# waits instead of hiding them, so one stage wins, and the shipped config's two stages rank below it. The pick is
# written as an overlay that the train command takes after the config (`--config X --config best.yaml`; its
# placement replaces the config's whole). `--explain` shows the plan with it, and, since this config carries
# `profile_data`, whether a placement is the autotune's pick:

# %%
best = result.best.layout
write_overlay(best, OUT / "01_best.yaml", "tutorial 01")
code, plan = explain("--config", str(OUT / "01_best.yaml"), *PROFILE)
print(plan)
assert code == 0 and f"3 rollout: {len(best.env)} env rank(s) x {best.stages} pipeline stage(s)" in plan
assert "autotune (profile_data): this placement and depth are its pick" in plan
code, plan = explain(*PROFILE)  # the shipped config's own placement: two stages
assert code == 0 and "autotune (profile_data): not its pick" in plan
assert not multiprocessing.active_children()

# %% [markdown]
# The reasoning half is the same command on a reasoning config (`python -m rlinf_mini.autotune --config
# configs/math.yaml`, under a minute on 2 cores): it times one chunk's generation against the chunk's size, its
# reward and the actor's update with the workers' own code (`rlinf_mini/autotune/reasoning.py`, whose docstring
# holds the formula), and ranks the cuts of rollout -> reward -> actor with every chunk count ("stages": the
# rollout scores chunk c while it generates c + 1; the actor waits for all its chunks). RLinf's reasoning keys
# (`rollout_cost`, `actor_cost`, `inference_cost`: seconds of a step on all devices) skip the timing:

# %%
MATH_PROFILE = ["profile_data.rollout_cost=0.05", "profile_data.actor_cost=0.1", "profile_data.inference_cost=0.02",
                "profile_data.hop_s=0.01", "profile_data.fixed_s=0.002"]
math = autotune(load_config(["--config", str(ROOT / "configs/math.yaml"), *MATH_PROFILE]), "configs/math.yaml",
                progress=False)
print(table(math))
# micro_batch_size = global_batch_size = 128: one actor rank, so every layout with two is refused, by name
assert all(len(r.layout.actor) == 2 and "refused: " in r.refusal for r in math.rows if r.refusal)
assert all(len(r.layout.actor) == 1 for r in math.rows if not r.refusal)

# %% [markdown]
# Predictions against measurement: `python -m benchmarks.autotune_check` measures every candidate with the real
# runner in five regimes (env-bound, policy-bound, balanced, MetaWorld, and the reasoning math config); where it has
# run, its env-bound and math grids are printed here, measured beside predicted (nothing is asserted about them:
# they depend on the machine's load).

# %%
import json

check = ROOT / "benchmarks/autotune_check.json"
if check.exists():
    for regime in json.loads(check.read_text())["regimes"]:
        if regime["regime"] in ("env-bound", "math"):
            print(regime["regime"])
            for g in regime["grid"]:
                print(f"{g['placement']} stages {g['stages']}: predicted {g['predicted_step_s']:.3f} s, "
                      f"measured {g['measured_step_s']:.3f} s")

# %% [markdown]
# ## The RLinf counterpart
#
# - `rlinf/scheduler/placement/placement.py::ComponentPlacement`: the same grammar, `get_strategy`,
#   `get_world_size`, `get_hardware_ranks`; its strategy object is `FlexiblePlacementStrategy`
#   (`hardware_ranks_list`: the devices of each process), which ours mirrors as `PlacementStrategy`.
# - `rlinf/utils/placement.py::HybridComponentPlacement` and `PlacementMode` (COLLOCATED, DISAGGREGATED, HYBRID).
#   RLinf's HybridComponentPlacement always reports HYBRID; ours classifies the layout.
# - `rlinf/scheduler/cluster/cluster.py::Cluster.allocate`: a Ray actor per rank with `CUDA_VISIBLE_DEVICES` set
#   (RLinf#353: users found that the YAML's device ids are not the physical GPU ids; ours become
#   `CUDA_VISIBLE_DEVICES` in `rlinf_mini/scheduler/cluster.py::Cluster.allocate`, worth reading for that question).
# - Left out here: node groups, several machines, robots as hardware, `PlacementMode.AUTO`.
#
# ## Exercise
#
# Write `devices_of_ranks(value, num_devices)`: the device tuple of every process of one placement string, in rank
# order (e.g. `"0-3:0-1"` → `[(0, 1), (2, 3)]`). Replace the body; the cell compares it with the parser on the
# cases below, which cover every form of the grammar.

# %%
from workbench import check_exercise, matches

from stages.placement import ComponentPlacement


def reference_devices(value: str, num_devices: int) -> list[tuple[int, ...]]:
    return [p.devices for p in ComponentPlacement({"x": value}, num_devices).get_strategy("x").placements]


def devices_of_ranks(value: str, num_devices: int) -> list[tuple[int, ...]]:
    # EXERCISE: parse `value` yourself (ranges "a-b", commas, "all", "devices:processes").
    return reference_devices(value, num_devices)


CASES = {"all devices": ("all", 3), "one device": ("2", 4), "a range": ("0-3", 4), "commas and ranges": ("0,2,4-5", 6),
         "two processes per device": ("0-3:0-7", 4), "two devices per process": ("0-3:0-1", 4),
         "two parts, one of them devices:processes": ("0-1:0-3,2-3", 4)}
check_exercise(devices_of_ranks, reference_devices, CASES)

assert not matches(lambda v, n: [(d,) for d in range(n)], reference_devices, CASES)  # "everything is all": fails
