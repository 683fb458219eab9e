"""Counter-based random numbers: the noise for env id `g` at counter `c` is a pure function of (seed, g, c).

Why not a torch.Generator? A generator's output depends on how many numbers were drawn before, so splitting the same
envs into 1 or 2 pipeline stages (or 1 or 2 ranks) would change every sample. Hashing (seed, env id, counter, index)
gives every env its own stream that no batch layout can disturb, and resuming needs no generator state: only the
counter. The hash is splitmix64's finalizer (Steele et al., 2014) on int64 tensors.
"""

from __future__ import annotations

import torch

# splitmix64 constants, as signed int64 (torch has no uint64 arithmetic).
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_C1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_C2 = 0x94D049BB133111EB - (1 << 64)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (`>>` is arithmetic on negative numbers)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    # int64 multiplication wraps modulo 2**64 on every torch backend we run on, as splitmix64 needs.
    x = (x ^ _shr(x, 30)) * _C1
    x = (x ^ _shr(x, 27)) * _C2
    return x ^ _shr(x, 31)


def counter_uniform(seed: int, ids: torch.Tensor, counter: int | torch.Tensor, n: int) -> torch.Tensor:
    """Uniform floats in (0, 1), shape [B, n], for stream ids [B] at `counter` (an int or a [B] tensor).

    Row b depends only on (seed, ids[b], counter[b]); column j is the j-th number of that row.
    """
    ids = ids.to(torch.int64).reshape(-1, 1)  # [B, 1]
    counter = torch.as_tensor(counter, dtype=torch.int64).reshape(-1, 1)  # [B, 1] or [1, 1]
    cols = torch.arange(n, dtype=torch.int64).reshape(1, -1)  # [1, n]
    h = _mix(torch.tensor(seed, dtype=torch.int64) * _GOLDEN + _GOLDEN)
    h = _mix(h + ids * _GOLDEN)
    h = _mix(h + counter * _GOLDEN)
    h = _mix(h + (cols + 1) * _GOLDEN)  # [B, n]
    # top 24 bits -> float32 exactly; the half-step offset keeps 0 and 1 out, so log(u) and ndtri(u) stay finite.
    return (_shr(h, 40).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def counter_normal(seed: int, ids: torch.Tensor, counter: int | torch.Tensor, n: int) -> torch.Tensor:
    """Standard normal floats, shape [B, n], by the inverse CDF of `counter_uniform`."""
    return torch.special.ndtri(counter_uniform(seed, ids, counter, n))
