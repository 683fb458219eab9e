"""Observations and model inputs are a tensor (state vectors) or a dict of tensors (images, token ids, ...): these
helpers apply one tensor operation to either, so the rollout and the actor handle both with the same lines.

    tree_map(lambda t: t[idx], obs)        tree_cat([obs_a, obs_b], dim=1)        tree_stack([obs_t0, obs_t1])
    tree_cat_split([obs_a, obs_b, obs_c, obs_d], 2, dim=1)     # tree_cat(..., dim=1) cut into 2 equal pieces
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


def tree_cat_split(blocks: list[Tree], n: int, dim: int = 1) -> list[Tree]:
    """tree_cat(blocks, dim) cut into n equal pieces along `dim`, without building the whole: a piece that is one
    block (or lies inside one) is that block (a view of it); only a piece across blocks is a cat of their parts."""
    sizes = [(b if isinstance(b, torch.Tensor) else next(iter(b.values()))).shape[dim] for b in blocks]
    width = sum(sizes) // n
    starts = [sum(sizes[:i]) for i in range(len(blocks))]
    pieces = []
    for lo in range(0, n * width, width):
        parts = []
        for block, start, size in zip(blocks, starts, sizes, strict=True):
            a, z = max(lo, start), min(lo + width, start + size)
            if a < z:  # the columns [a, z) of the piece lie in this block
                whole = (a, z) == (start, start + size)
                parts.append(block if whole else tree_map(lambda t, a=a, z=z, s=start: t.narrow(dim, a - s, z - a),
                                                            block))
        pieces.append(parts[0] if len(parts) == 1 else tree_cat(parts, dim=dim))
    return pieces
