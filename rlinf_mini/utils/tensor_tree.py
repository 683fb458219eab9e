"""Observations and model inputs are a tensor (state vectors) or a dict of tensors (images, token ids, ...): these
three helpers apply one tensor operation to either, so the rollout and the actor handle both with the same lines.

    tree_map(lambda t: t[idx], obs)        tree_cat([obs_a, obs_b], dim=1)        tree_stack([obs_t0, obs_t1])
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tree = torch.Tensor | dict[str, torch.Tensor]


def tree_map(fn: Callable[[torch.Tensor], torch.Tensor], x: Tree) -> Tree:
    return {k: fn(v) for k, v in x.items()} if isinstance(x, dict) else fn(x)


def tree_cat(xs: list[Tree], dim: int = 0) -> Tree:
    if isinstance(xs[0], dict):
        return {k: torch.cat([x[k] for x in xs], dim=dim) for k in xs[0]}
    return torch.cat(xs, dim=dim)


def tree_stack(xs: list[Tree], dim: int = 0) -> Tree:
    if isinstance(xs[0], dict):
        return {k: torch.stack([x[k] for x in xs], dim=dim) for k in xs[0]}
    return torch.stack(xs, dim=dim)
