"""The autotune's cost model: measured costs -> the predicted time of one training step of a layout.

What is measured (`profile.py`, or given as RLinf's `profile_data`), each on one device:
  E(n)  one chunk step of n sub-envs (env.train.step_latency_s included: a wait, the core stays free)
  P(n)  one policy inference over n sub-envs (rollout.policy_latency_s included, also a wait)
  A(m)  one step's update (update_epoch passes) over m samples on one actor rank
  hop   what one channel message adds to a chunk step; fixed: the rest of a step (sync, advantages, dispatch)
What is fit: each of E, P, A is affine in its batch, a + b * n (least squares); a batch that was measured is used
as measured, the fit only fills the gaps (RLinf's DataFitter does the same with a choice of curves).

The pipeline formula. A layout puts W_e env ranks, W_r rollout ranks and W_a actor ranks on devices (one rank per
device) with S pipeline stages: an env call steps n = N / (W_e S) sub-envs, a rollout rank serves k = W_e / W_r env
ranks, one call each. A chunk step of all stages takes at least each of
  E + P + 2 hop    one stage's round trip: its env step, its inference, and each of its two messages, which
                   costs its receiver `hop` (waking up, reading it) before the work can start
  S (E + hop)      the env rank's work;   S k (P + hop): the rollout rank's work
  S (cE + k cP)    the compute of the env and rollout ranks sharing one device (c = the cost minus its waits: waits
                   overlap, compute on one core does not), + S (1 + k) hop there
and the slowest of these is the cycle. It assumes the stages are equal, the queues never fill, ranks on different
devices do not slow each other, and an env rank's stages run in turn. A rollout epoch is T cycles plus the last
inference round for the bootstrap values (S k P); then the update, A(N T / W_a), runs on the actor ranks side by
side, then `fixed`. Predicted bubble: the share of the rollout phase in which the busier of env and rollout waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stages.placement import HybridComponentPlacement

COMPONENTS = ("env", "rollout", "actor")


@dataclass(frozen=True)
class Affine:
    """cost(n) = a + b n, fit by least squares to measured points {n: seconds}; a measured n returns its point."""

    points: tuple[tuple[int, float], ...]

    @classmethod
    def of(cls, data: dict[int, float]) -> Affine:
        return cls(tuple(sorted(data.items())))

    @property
    def coefficients(self) -> tuple[float, float]:
        xs, ys = [float(x) for x, _ in self.points], [y for _, y in self.points]
        if len(xs) == 1:  # one point: proportional to the batch (RLinf's scaling of a single measured cost)
            return 0.0, ys[0] / xs[0]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        return my - b * mx, b

    def __call__(self, n: int) -> float:
        measured = dict(self.points)
        if n in measured:
            return measured[n]
        a, b = self.coefficients
        return max(a + b * n, 0.0)


@dataclass(frozen=True)
class Workload:
    """The step's sizes, from the config: N sub-envs, T chunk steps per rollout epoch, rollout epochs."""

    num_envs: int
    chunk_steps: int
    rollout_epochs: int
    eval_num_envs: int

    @property
    def samples(self) -> int:
        return self.num_envs * self.chunk_steps * self.rollout_epochs


@dataclass(frozen=True)
class Costs:
    """The fitted costs the formula reads; waits are the latency knobs' part of E and P (seconds per call)."""

    env: Affine
    policy: Affine
    actor: Affine
    env_wait_s: float = 0.0
    policy_wait_s: float = 0.0
    hop_s: float = 0.0
    fixed_s: float = 0.0
    # memory (bytes): a worker process at rest, the weights, one trajectory sample, one sub-env's state
    process_bytes: int = 0
    weight_bytes: int = 0
    sample_bytes: int = 0
    subenv_bytes: int = 0


@dataclass(frozen=True)
class Layout:
    """A candidate: the device of each rank of env, rollout and actor (one rank per device), and the stages."""

    env: tuple[int, ...]
    rollout: tuple[int, ...]
    actor: tuple[int, ...]
    stages: int
    kind: str = ""  # collocated / hybrid / disaggregated, as the search built it

    def placement(self) -> dict[str, str]:
        return placement_text({name: getattr(self, name) for name in COMPONENTS})

    def describe(self) -> str:
        return " | ".join(f"{k}: {v}" for k, v in self.placement().items())


def placement_text(ranks: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """cluster.component_placement of {component: the device of each rank}: components on the same devices share one
    key ('env,rollout,actor')."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for name, devices in ranks.items():
        groups.setdefault(devices, []).append(name)
    num_devices = 1 + max(max(devices) for devices in ranks.values())
    return {",".join(names): _device_text(devices, num_devices) for devices, names in groups.items()}


def _device_text(devices: tuple[int, ...], num_devices: int) -> str:
    if devices == tuple(range(num_devices)) and num_devices > 1:
        return "all"
    if len(devices) == 1:
        return str(devices[0])
    return f"{devices[0]}-{devices[-1]}"


@dataclass
class Prediction:
    step_s: float
    generate_s: float
    train_s: float
    bubble: float  # 0..1
    memory_bytes: dict[int, int] = field(default_factory=dict)  # device -> peak bytes


def cycle_terms(E: float, P: float, cE: float, cP: float, hop: float, stages: int, k: int,
                ranks_per_device: list[tuple[int, int]]) -> dict[str, float]:
    """The lower bounds on one chunk step of all stages (module docstring); ranks_per_device: (env ranks, rollout
    ranks) on each device."""
    device = max(stages * (e * cE + r * k * cP + (e + r * k) * hop * (e > 0 and r > 0)) for e, r in ranks_per_device)
    return {"round trip": E + P + 2 * hop, "env": stages * (E + hop), "rollout": stages * k * (P + hop),
            "device": device}


def predict(layout: Layout, costs: Costs, work: Workload) -> Prediction:
    """The predicted step of `layout` (module docstring). The layout must pass the batch checks (N divisible)."""
    S, we, wr, wa = layout.stages, len(layout.env), len(layout.rollout), len(layout.actor)
    n, k = work.num_envs // (we * S), we // wr  # sub-envs per env call; env ranks per rollout rank
    E, P = costs.env(n), costs.policy(n)
    cE, cP = max(E - costs.env_wait_s, 0.0), max(P - costs.policy_wait_s, 0.0)
    devices = sorted(set(layout.env) | set(layout.rollout) | set(layout.actor))
    ranks = [(layout.env.count(d), layout.rollout.count(d)) for d in devices]
    terms = cycle_terms(E, P, cE, cP, costs.hop_s, S, k, ranks)
    cycle = max(terms.values())
    generate = work.rollout_epochs * (work.chunk_steps * cycle + S * k * (P + costs.hop_s))
    train = costs.actor(work.samples // wa)
    busiest = max(terms["env"], terms["rollout"]) * work.chunk_steps * work.rollout_epochs
    memory = {}
    for d in devices:
        e, r, a = layout.env.count(d), layout.rollout.count(d), layout.actor.count(d)
        env_b = costs.subenv_bytes * (work.num_envs // we) + costs.sample_bytes * work.samples // we
        actor_b = 4 * costs.weight_bytes + 3 * costs.sample_bytes * work.samples // wa  # weights, grads, Adam m, v
        memory[d] = (e + r + a) * costs.process_bytes + e * env_b + r * 2 * costs.weight_bytes + a * actor_b
    return Prediction(generate + train + costs.fixed_s, generate, train, max(0.0, 1 - busiest / generate), memory)


def layout_of(component_placement: dict[str, str], num_devices: int, stages: int) -> Layout:
    """The Layout of a config's placement (one rank per device or not: the devices of every rank)."""
    p = HybridComponentPlacement(component_placement, num_devices)
    ranks = {c: tuple(pl.devices[0] for pl in p.get_strategy(c).placements) for c in COMPONENTS}
    return Layout(ranks["env"], ranks["rollout"], ranks["actor"], stages, p.placement_mode.value)
