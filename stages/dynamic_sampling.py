"""Between stage 3'' and 4' (reasoning) — DAPO's dynamic sampling: drop the groups whose rewards are all equal
(their GRPO advantages are zero: no signal) and refill their slots with groups for new prompts, round by round.

    groups = split_groups(scored_chunk, G)                          # one dict per group of G responses
    groups, stats = dynamic_sampling(groups, sample, G, max_resample)   # sample(n, round) -> n new scored groups
    chunks = [join_groups(groups[i:i + per_chunk]) for i in ...]    # back into chunks for the actor

A group is dropped when max(r) == min(r) over its G rewards (DAPO, arXiv 2503.14476, eq. 11: 0 < |correct| < G
for ±1 rewards). After max_resample rounds, the groups still all equal stay (the batch keeps its size).
RLinf counterpart: `docs/source-en/rst_source/reference/algorithms/dapo.rst` (`max_resample`; no code there); veRL's
`filter_groups` (`max_num_gen_batches`, which raises at the bound instead). Next stage: `stages/reasoning_train.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# the per-response entries of a scored chunk [N, ...] (the rest, e.g. version, is per chunk)
ROW_KEYS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs", "rewards")


def constant_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """rewards [N] (groups of G consecutive) -> [N / G] bool: True where every reward of the group is equal."""
    grouped = rewards.view(-1, group_size)  # [N/G, G]
    return grouped.max(dim=-1).values == grouped.min(dim=-1).values


def split_groups(chunk: dict, group_size: int) -> list[dict]:
    """A scored chunk (N responses) -> N / G dicts, one per group: rows [G, ...], answers [G], version."""
    n = len(chunk["rewards"])
    return [{**{k: chunk[k][s:s + group_size] for k in ROW_KEYS}, "answers": chunk["answers"][s:s + group_size],
             "version": chunk["version"]} for s in range(0, n, group_size)]


def join_groups(groups: list[dict]) -> dict:
    """Groups (of possibly different prompt and response widths) -> one chunk: prompts left-padded to the widest P,
    responses right-padded to the widest R (pad id 0 under mask 0: never attended, never in a loss)."""
    P = max(g["prompt_ids"].shape[1] for g in groups)
    R = max(g["response_ids"].shape[1] for g in groups)

    def pad(t: torch.Tensor, width: int, left: bool) -> torch.Tensor:
        extra = width - t.shape[1]
        return torch.nn.functional.pad(t, (extra, 0) if left else (0, extra))

    out = {k: torch.cat([pad(g[k], P, True) for g in groups]) for k in ("prompt_ids", "prompt_mask")}
    out |= {k: torch.cat([pad(g[k], R, False) for g in groups]) for k in ("response_ids", "response_mask",
                                                                           "logprobs")}
    return out | {"rewards": torch.cat([g["rewards"] for g in groups]),
                  "answers": [a for g in groups for a in g["answers"]], "version": groups[0]["version"]}


def dynamic_sampling(groups: list[dict], sample: Callable[[int, int], list[dict]], group_size: int,
                     max_resample: int) -> tuple[list[dict], dict[str, float]]:
    """Keep the groups with a signal; regenerate the others' slots with sample(how many, round) for up to
    max_resample rounds. Returns as many groups as given (the informative first) and the counts."""
    def informative(gs: list[dict]) -> tuple[list[dict], list[dict]]:
        flat = [not bool(constant_groups(g["rewards"], group_size)[0]) for g in gs]
        return [g for g, ok in zip(gs, flat, strict=True) if ok], [g for g, ok in zip(gs, flat, strict=True) if not ok]

    kept, pending = informative(groups)
    dropped, rounds = 0, 0
    while pending and rounds < max_resample:
        rounds += 1
        dropped += len(pending)
        new_kept, pending = informative(sample(len(pending), rounds))
        kept += new_kept
    return kept + pending, {"rollout/dropped_groups": float(dropped), "rollout/resample_rounds": float(rounds),
                            "rollout/constant_groups_kept": float(len(pending))}
