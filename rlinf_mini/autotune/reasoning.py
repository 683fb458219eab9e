"""The reasoning half of the autotune: rollout -> reward -> actor, its cost model, its layouts, its measurements.

What the runner does in one step (runners/reasoning.py, stages/reasoning_*.py), which is all the model assumes:
  sync      actor rank 0 writes its weights into every rollout rank's buffer; the step waits for it
  rollout   the step's K chunks (data.rollout_batch_size / algorithm.rollout_batch_size_per_gpu prompts, each
            group_size times: b responses a chunk) go round-robin to the W_r rollout ranks; a rank generates its
            chunks one after the other
  reward    the W_w reward ranks score the chunks round-robin, in chunk order, each as soon as it is generated:
            the one overlap the runner makes is scoring chunk c while chunk c + 1 is generated
  actor     actor rank a takes the a-th contiguous block of K / W_a chunks; it starts once all of them are scored
            (advantages, log-prob recompute, update_epoch passes with a gradient all-reduce per optimizer step):
            generation and training never overlap, within a step or across steps
What is measured (`profile`, on one device, with the code the workers run), or given as RLinf's `profile_data`:
  G(b)  generating one chunk of b responses (rollout.fast_generation as configured)
  R(b)  scoring one chunk (decode, the reward functions)
  A(m)  the actor's work on m responses on one rank (stack, advantages, recompute, the update)
  from a short run of the real runner (`calibrate`): hop (what a channel message between two devices adds before
  its receiver starts: that rank sleeps on a core of its own and must be woken and scheduled there; between ranks
  of one device it adds nothing, as the receiver takes the core when the sender goes back to waiting),
  sync (seconds per rollout rank: time/sync_weights), fixed (the rest of time/step), and A at the real placement
What is fit: G, R and A are affine in their batch, a + b n (model.Affine: a measured batch is used as measured).

The formula (x_c: 1 where chunk c's message crosses devices, else 0). Chunk c's generation ends at
g_c = g_(c - W_r) + G(b) (its prompts wait in the channel); its scoring at s_c = max(s_(c - W_w), g_c + x_c hop) +
R(b); actor rank a is ready at ready_a = the latest s_c + x_c hop of its block; the step's generate-and-train ends
at the slowest of
  ready_a + A(N / W_a)         for every actor rank (the all-reduce ties them: the last one sets the end)
  work_d                       every device's compute: the chunks its rollout and reward ranks handle, x G or x R,
                               plus A for each actor rank on it (ranks on one device share its core: compute on
                               one core does not overlap)
and ready_a itself is at least the rollout and reward work on each device up to a's last chunk. Then
step = W_r sync + that + fixed. It assumes the ranks of a component cost alike and ranks on different devices do
not slow each other. Where no device holds two components it is exact (the chains are the whole story); where one
does, it is a lower bound: ranks sharing a core also stretch each other's chains, which only the device term sees
(tests/test_autotune.py bounds the gap against a simulation in which shared ranks split their core evenly).
Bubble: the share of device-time with no compute, 1 - sum_d work_d / (D x step). Memory per device: per rank a
process at rest, a rollout rank the weights twice (the model and its receive buffer), an actor rank four times
(weights, gradients, Adam's two moments; a fifth with a reference model) plus its m responses' logits, their
log-softmax and its gradient (fp32, response length + 1 positions x vocabulary).

The search (`candidate_layouts`): RLinf's cut search on the chain rollout -> reward -> actor, recursively: both sides
of a cut on the same devices (collocated), on a split of them (disaggregated, both orders), or one side on all of
them and the other on a part (hybrid: RLinf's search refuses hybrids for reasoning; this runtime runs them, so they
are ranked). Each layout is tried with every chunk count K that divides data.rollout_batch_size, up to --max-stages
(the overlay sets algorithm.rollout_batch_size_per_gpu; the sampling noise does not change with it: each
response draws from its own stream). Refusals: every check a reasoning run makes before it starts (batch
divisibility over the actor ranks), and memory.

RLinf counterpart: `toolkits/auto_placement/` with the reasoning graph (rollout -> inference -> actor; node.py's
RolloutNode / MegatronNode costs from profile_data.rollout_cost, inference_cost and actor_cost).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

import torch

from rlinf_mini.autotune.model import Affine, Prediction, placement_text
from rlinf_mini.config import ConfigError, TrainConfig

COMPONENTS = ("rollout", "reward", "actor")


@dataclass(frozen=True)
class ReasoningWorkload:
    prompts: int  # data.rollout_batch_size
    group: int  # algorithm.group_size

    @property
    def responses(self) -> int:
        return self.prompts * self.group

    def chunk_counts(self, max_chunks: int) -> list[int]:
        return [k for k in range(1, min(self.prompts, max_chunks) + 1) if self.prompts % k == 0]


@dataclass(frozen=True)
class ReasoningCosts:
    generate: Affine  # G(b): seconds of one chunk of b responses
    reward: Affine  # R(b)
    actor: Affine  # A(m): m responses on one rank
    hop_s: float = 0.0
    sync_s: float = 0.0  # per rollout rank
    fixed_s: float = 0.0
    process_bytes: int = 0
    weight_bytes: int = 0
    sample_bytes: int = 0  # one response's logits, log-softmax and gradient in the update
    reference_model: bool = False


@dataclass(frozen=True)
class ReasoningLayout:
    """The devices of each rank of rollout, reward and actor (one rank per device), and K chunks a step (`stages`
    in the table: the depth of the rollout -> reward pipeline)."""

    rollout: tuple[int, ...]
    reward: tuple[int, ...]
    actor: tuple[int, ...]
    stages: int
    kind: str = ""
    prompts_per_chunk: int = 0  # algorithm.rollout_batch_size_per_gpu: data.rollout_batch_size / stages

    def placement(self) -> dict[str, str]:
        return placement_text({c: getattr(self, c) for c in COMPONENTS})

    def describe(self) -> str:
        return " | ".join(f"{k}: {v}" for k, v in self.placement().items())

    def key(self) -> tuple:
        return self.rollout, self.reward, self.actor, self.stages


def predict_reasoning(layout: ReasoningLayout, costs: ReasoningCosts, work: ReasoningWorkload) -> Prediction:
    """The predicted step of `layout` (module docstring); K must divide the prompts and the actor ranks K."""
    K, hop = layout.stages, costs.hop_s
    b = work.responses // K
    wr, ww, wa = len(layout.rollout), len(layout.reward), len(layout.actor)
    m = work.responses // wa
    G, R, A = costs.generate(b), costs.reward(b), costs.actor(m)
    devices = sorted(set(layout.rollout) | set(layout.reward) | set(layout.actor))
    g, s, work_upto = [0.0] * K, [0.0] * K, []  # work_upto[c]: {device: compute of chunks 0..c}
    acc = dict.fromkeys(devices, 0.0)
    per = K // wa
    for c in range(K):
        src, dst = layout.rollout[c % wr], layout.reward[c % ww]
        g[c] = (g[c - wr] if c >= wr else 0.0) + G  # its prompts were put before the rollout started
        s[c] = max(s[c - ww] if c >= ww else 0.0, g[c] + hop * (src != dst)) + R
        acc[src] += G
        acc[dst] += R
        work_upto.append(dict(acc))
    # actor rank a: its block's scored chunks, each a hop later when it crosses devices
    ready = [max(max(s[c] + hop * (layout.reward[c % ww] != layout.actor[a]) for c in range(a * per, (a + 1) * per)),
                 max(work_upto[(a + 1) * per - 1].values())) for a in range(wa)]
    work_d = {d: acc[d] + layout.actor.count(d) * A for d in devices}
    generate_and_train = max(max(r + A for r in ready), max(work_d.values()))
    generate = max(max(s), max(work_upto[-1].values()))
    step = wr * costs.sync_s + generate_and_train + costs.fixed_s
    actor_bytes = (5 if costs.reference_model else 4) * costs.weight_bytes + m * costs.sample_bytes
    memory = {d: (layout.rollout.count(d) + layout.reward.count(d) + layout.actor.count(d)) * costs.process_bytes
              + layout.rollout.count(d) * 2 * costs.weight_bytes + layout.actor.count(d) * actor_bytes
              for d in devices}
    bubble = 1 - sum(work_d.values()) / (len(devices) * step) if step > 0 else 0.0
    return Prediction(step, generate, A, max(bubble, 0.0), memory)


# --------------------------------------------------------------------------------------------------------------------
# The search


def _sub_layouts(chain: tuple[str, ...], devices: tuple[int, ...]) -> list[dict[str, tuple[int, ...]]]:
    """Every placement of `chain` on `devices` by recursive cuts: {component: the device of each of its ranks}."""
    if len(chain) == 1:
        return [{chain[0]: devices}]
    out = []
    for i in range(1, len(chain)):
        first, second = chain[:i], chain[i:]
        pairs = [(devices, devices)]  # collocated
        for d in range(1, len(devices)):
            low, high = devices[:d], devices[d:]
            pairs += [(low, high), (high, low),  # disaggregated, both orders
                      (devices, low), (devices, high), (low, devices), (high, devices)]  # hybrid
        out += [a | b for a_devs, b_devs in pairs for a in _sub_layouts(first, a_devs)
                for b in _sub_layouts(second, b_devs)]
    return out


def candidate_layouts(num_devices: int, work: ReasoningWorkload, max_chunks: int) -> list[ReasoningLayout]:
    """The cut search's layouts, each once, collocated, then disaggregated, then hybrid, each with every chunk count.
    A layout and its mirror image on reversed devices are two: chunk c goes to rank c mod W of each component, so
    which chunks cross devices differs between them."""
    D, seen, layouts = num_devices, set(), []
    for ranks in _sub_layouts(COMPONENTS, tuple(range(D))):
        key = tuple(ranks[c] for c in COMPONENTS)
        if key not in seen:
            seen.add(key)
            layouts.append(key)
    order = ("collocated", "disaggregated", "hybrid")
    layouts.sort(key=lambda key: order.index(kind_of(key, D)))  # stable: the search's order within a kind
    return [ReasoningLayout(*key, stages=k, kind=kind_of(key, D), prompts_per_chunk=work.prompts // k)
            for k in work.chunk_counts(max_chunks) for key in layouts]


def kind_of(ranks: tuple[tuple[int, ...], ...], num_devices: int) -> str:
    """collocated: every component on every device; disaggregated: components share all of their devices or none;
    hybrid: the rest (a component over devices that another shares only in part)."""
    if all(r == tuple(range(num_devices)) for r in ranks):
        return "collocated"
    if all(a == b or not set(a) & set(b) for a in ranks for b in ranks):
        return "disaggregated"
    return "hybrid"


def layout_config(cfg: TrainConfig, layout: ReasoningLayout) -> TrainConfig:
    """cfg with `layout`'s placement and chunk size: what the overlay written for it gives."""
    return dataclasses.replace(
        cfg, cluster=dataclasses.replace(cfg.cluster, component_placement=layout.placement()),
        algorithm=dataclasses.replace(cfg.algorithm, rollout_batch_size_per_gpu=layout.prompts_per_chunk))


def check_reasoning_plan(cfg: TrainConfig, source: str) -> None:
    """Every check a reasoning run makes on the numbers before a process starts (train.py's ReasoningRunPlan)."""
    from rlinf_mini.config import check_reasoning_batch_arithmetic, validate_config
    from rlinf_mini.explain import num_devices
    from stages.placement import ReasoningComponentPlacement

    validate_config(cfg, source)
    p = ReasoningComponentPlacement(cfg.cluster.component_placement, num_devices(cfg))
    check_reasoning_batch_arithmetic(cfg, *(p.get_world_size(c) for c in COMPONENTS), source)


def layout_of(cfg: TrainConfig, num_devices: int) -> ReasoningLayout:
    """The layout of cfg's own placement and chunk size."""
    from stages.placement import ReasoningComponentPlacement

    p = ReasoningComponentPlacement(cfg.cluster.component_placement, num_devices)
    key = tuple(tuple(pl.devices[0] for pl in p.get_strategy(c).placements) for c in COMPONENTS)
    return ReasoningLayout(*key, stages=chunks_of(cfg), kind=kind_of(key, num_devices),
                           prompts_per_chunk=cfg.algorithm.rollout_batch_size_per_gpu)


def workload(cfg: TrainConfig) -> ReasoningWorkload:
    return ReasoningWorkload(cfg.data.rollout_batch_size, cfg.algorithm.group_size)


def chunks_of(cfg: TrainConfig) -> int:
    return cfg.data.rollout_batch_size // cfg.algorithm.rollout_batch_size_per_gpu


def needed_sizes(layouts: list[ReasoningLayout], work: ReasoningWorkload) -> tuple[set[int], dict[int, int]]:
    """Responses per chunk the layouts call, and {responses per actor rank: actor ranks}."""
    return ({work.responses // lay.stages for lay in layouts},
            {work.responses // len(lay.actor): len(lay.actor) for lay in layouts})


# --------------------------------------------------------------------------------------------------------------------
# RLinf's profile_data


def given_costs(cfg: TrainConfig, num_devices: int, source: str) -> ReasoningCosts | None:
    """The costs from cfg.profile_data, or None when it gives no rollout and no actor cost. RLinf's reasoning keys
    are seconds of a whole step's batch with the component on all devices: rollout_cost (generation), actor_cost
    (the update) and inference_cost (the log-prob recompute, which the actor does here); they become one point each
    of G (at the config's chunk, all devices generating) and A (N / D responses a rank), proportional to the batch.
    rollout_profile_data (responses per chunk -> seconds) and actor_profile_data (responses per rank -> seconds)
    give curves instead. The reward is not in RLinf's search: 0 here."""
    from rlinf_mini.autotune.profile import _points, all_or_none

    pd, work = cfg.profile_data, workload(cfg)
    generate = _points(pd.rollout_profile_data, "rollout_profile_data", source)
    actor = _points(pd.actor_profile_data, "actor_profile_data", source)
    chunks = chunks_of(cfg)
    if not generate and pd.rollout_cost > 0:  # the step's chunks shared by D ranks: chunks / D each, one at a time
        generate = {work.responses // chunks: pd.rollout_cost * num_devices / chunks}
    if not actor and pd.actor_cost + pd.inference_cost > 0:
        actor = {work.responses // num_devices: pd.actor_cost + pd.inference_cost}
    given = {"rollout_cost (or rollout_profile_data)": generate, "actor_cost (or actor_profile_data)": actor}
    if not all_or_none(given, source, "give the rollout's and the actor's costs, or neither to profile both"):
        return None
    return ReasoningCosts(Affine.of(generate), Affine.of({1: 0.0}), Affine.of(actor), hop_s=max(pd.hop_s, 0.0),
                          fixed_s=max(pd.fixed_s, 0.0))


# --------------------------------------------------------------------------------------------------------------------
# Measuring


class _Chunks:
    """The actor's input channel, in process: chunk c of the step."""

    def __init__(self, chunks: list[dict]):
        self.chunks = chunks

    def get(self, key, expected_from=""):
        return self.chunks[key[1]]


def profile(cfg: TrainConfig, source: str, chunk_sizes: set[int], actor_sizes: dict[int, int], reps: int = 16,
            progress=None) -> ReasoningCosts:
    """G(b) and R(b) for every b in chunk_sizes, A(m) for each {responses per rank m: actor ranks}, with the
    workers' own code in this process (the threads of one rank). Makes the data and the model folder if missing."""
    from rlinf_mini.autotune.profile import _median_time, _rss_bytes
    from rlinf_mini.config import max_new_tokens
    from rlinf_mini.models.tiny_lm import load_causal_lm
    from rlinf_mini.train import ReasoningRunPlan
    from rlinf_mini.utils.precision import autocast
    from stages.reasoning_reward import decode_responses, score_responses
    from stages.reasoning_rollout import generate
    from stages.reasoning_train import ReasoningActorWorker

    torch.set_num_threads(cfg.cluster.threads_per_device)
    plan = ReasoningRunPlan(cfg, source)
    plan.prepare()
    process_bytes = _rss_bytes()  # torch and transformers imported, no model yet: a rank at rest
    path = cfg.rollout.model.model_path or cfg.actor.model.model_path
    model, tokenizer = load_causal_lm(path)
    weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    G, train, sampling = cfg.algorithm.group_size, plan.train_set, cfg.algorithm.sampling_params
    calls = iter(range(1 << 30))  # every generate call draws other noise: other responses, other lengths

    def run(b: int) -> dict:
        prompts = [train.prompt_ids[i % len(train)] for i in range(b // G) for _ in range(G)]
        with autocast(cfg.rollout.model.precision, "cpu"):
            return generate(model, prompts, next(calls) * b + torch.arange(b), sampling, max_new_tokens(cfg),
                            tokenizer.pad_token_id, tokenizer.eos_token_id, cfg.actor.seed,
                            fast=cfg.rollout.fast_generation)

    gen_s, reward_s, results = {}, {}, {}
    for b in sorted(chunk_sizes):
        gen_s[b] = _median_time(lambda b=b: results.__setitem__(b, run(b)), max(2, reps // 4))
        out, answers = results[b], [train.answers[i % len(train)] for i in range(b // G) for _ in range(G)]

        def score(out=out, answers=answers):
            texts = decode_responses(tokenizer, out["response_ids"], out["response_mask"])
            score_responses(texts, answers, out["response_mask"].sum(dim=-1), cfg.reward, cfg.algorithm)

        reward_s[b] = _median_time(score, reps)
        if progress is not None:
            progress.update(1)
    largest = results[max(results)]
    rewards = torch.tensor([1.0, -1.0]).repeat(len(largest["response_ids"]) // 2 + 1)[:len(largest["response_ids"])]
    chunk = largest | {"rewards": rewards, "version": 0}
    actor_s = {}
    for m, world_size in sorted(actor_sizes.items()):
        one = dataclasses.replace(cfg.actor, global_batch_size=cfg.actor.global_batch_size // world_size)
        actor = ReasoningActorWorker.__new__(ReasoningActorWorker)  # one rank in this process, as a test makes one
        actor._rank, actor._world_size, actor._group_name, actor.device = 0, 1, "autotune", torch.device("cpu")
        actor.__init__(dataclasses.replace(cfg, actor=one))
        actor.init_worker()
        n_chunks = -(-m // len(chunk["rewards"]))
        steps = iter(range(1 << 30))
        try:
            actor_s[m] = _median_time(lambda n=n_chunks: actor.run_training(_Chunks([chunk] * n), n, next(steps), 1),
                                      max(2, reps // 8)) * m / (n_chunks * len(chunk["rewards"]))
        finally:
            actor.close()
        if progress is not None:
            progress.update(1)
    vocab = model.config.vocab_size
    return ReasoningCosts(Affine.of(gen_s), Affine.of(reward_s), Affine.of(actor_s), process_bytes=process_bytes,
                          weight_bytes=weight_bytes, sample_bytes=3 * 4 * (max_new_tokens(cfg) + 1) * vocab,
                          reference_model=cfg.algorithm.kl_beta > 0)


def calibrate(cfg: TrainConfig, costs: ReasoningCosts, work: ReasoningWorkload, layouts: list[ReasoningLayout],
              source: str, reps: int = 2) -> ReasoningCosts:
    """hop, sync, fixed and A at the real placement, from real steps of `layouts` (as profile.calibrate does for
    the embodied half): hop by least squares on the generate-and-train residual, sync = time/sync_weights per
    rollout rank, fixed = the rest of time/step; negative values are clamped to 0."""
    from rlinf_mini.autotune.profile import measure_steps

    base = dataclasses.replace(costs, hop_s=0.0, sync_s=0.0, fixed_s=0.0)
    measured = measure_steps({f"cal{i}": layout_config(cfg, lay) for i, lay in enumerate(layouts)}, reps, source)
    delta = 1e-3
    residual, slope, weight, runs = [], [], [], {}
    for i, lay in enumerate(layouts):  # {responses per actor rank: the runner's time/actor/train at that size}
        runs.setdefault(work.responses // len(lay.actor), []).append(measured[f"cal{i}"]["time/actor/train"])
    actor = dict(costs.actor.points) | {m: statistics.median(t) for m, t in runs.items()}
    base = dataclasses.replace(base, actor=Affine.of(actor))
    for i, lay in enumerate(layouts):
        m = measured[f"cal{i}"]
        p0 = predict_reasoning(lay, base, work)
        p1 = predict_reasoning(lay, dataclasses.replace(base, hop_s=delta), work)
        residual.append(m["time/generate_and_train"] - p0.step_s)
        slope.append((p1.step_s - p0.step_s) / delta)
        weight.append(1 / m["time/generate_and_train"] ** 2)
    hop = sum(w * r * s for w, r, s in zip(weight, residual, slope, strict=True)) / sum(
        w * s * s for w, s in zip(weight, slope, strict=True))
    sync = statistics.mean(measured[f"cal{i}"]["time/sync_weights"] / len(lay.rollout)
                           for i, lay in enumerate(layouts))
    fixed = statistics.mean(m["time/step"] - m["time/sync_weights"] - m["time/generate_and_train"]
                            for m in measured.values())
    return dataclasses.replace(base, hop_s=max(hop, 0.0), sync_s=max(sync, 0.0), fixed_s=max(fixed, 0.0))


def screen(cfg: TrainConfig, num_devices: int, max_chunks: int, source: str) -> list:
    """Every candidate layout as a search.Row, with the first check a run of it would fail (empty where it runs)."""
    from rlinf_mini.autotune.search import Row
    from stages.placement import PlacementError

    rows = []
    for lay in candidate_layouts(num_devices, workload(cfg), max_chunks):
        try:
            check_reasoning_plan(layout_config(cfg, lay), source)
            refusal = ""
        except (ConfigError, PlacementError) as e:
            refusal = "refused: " + str(e).splitlines()[0].removeprefix(f"{source}: ")
        rows.append(Row(lay, refusal=refusal))
    return rows
