"""Counter-based random numbers: the noise for env id `g` at counter `c` is a pure function of (seed, g, c).

Why not a torch.Generator? A generator's output depends on how many numbers were drawn before, so splitting the same
envs into 1 or 2 pipeline stages (or 1 or 2 ranks) would change every sample. Hashing (seed, env id, counter, index)
gives every env its own stream that no batch layout can disturb, and resuming needs no generator state: only the
counter. The hash is splitmix64's finalizer (Steele et al., 2014) on uint64 numpy arrays.
"""

from __future__ import annotations

import numpy
import torch

# splitmix64 constants.
_GOLDEN, _C1, _C2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK = (1 << 64) - 1
_S30, _S27, _S31, _S40 = (numpy.uint64(k) for k in (30, 27, 31, 40))


def _mix_int(x: int) -> int:
    """splitmix64's finalizer on one Python int (a scalar: ~1 us, where a numpy scalar op costs ~2 us)."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * _C1) & _MASK
    x = ((x ^ (x >> 27)) * _C2) & _MASK
    return x ^ (x >> 31)


def _mix(x: numpy.ndarray) -> numpy.ndarray:
    """The same on a uint64 array, in place: numpy's uint64 wraps modulo 2**64 and `>>` is a logical shift. (torch
    has no uint64 arithmetic; emulating it on int64 tensors cost ~260 us per call, as much as the MLP's inference.)"""
    x ^= x >> _S30
    x *= numpy.uint64(_C1)
    x ^= x >> _S27
    x *= numpy.uint64(_C2)
    x ^= x >> _S31
    return x


def counter_uniform(seed: int, ids: torch.Tensor, counter: int | torch.Tensor, n: int) -> torch.Tensor:
    """Uniform floats in (0, 1), shape [B, n], for stream ids [B] at `counter` (an int or a [B] tensor).

    Row b depends only on (seed, ids[b], counter[b]); column j is the j-th number of that row.
    """
    ids = torch.as_tensor(ids).to(torch.int64).numpy().astype(numpy.uint64).reshape(-1, 1)  # [B, 1]
    h = _mix(ids * numpy.uint64(_GOLDEN) + numpy.uint64(_mix_int(seed * _GOLDEN + _GOLDEN)))  # [B, 1]
    if isinstance(counter, int):
        h = _mix(h + numpy.uint64((counter * _GOLDEN) & _MASK))
    else:
        counter = torch.as_tensor(counter).to(torch.int64).numpy().astype(numpy.uint64).reshape(-1, 1)  # [B, 1]
        h = _mix(h + counter * numpy.uint64(_GOLDEN))
    cols = numpy.arange(1, n + 1, dtype=numpy.uint64) * numpy.uint64(_GOLDEN)  # [n]
    h = _mix(h + cols)  # [B, n]
    return torch.from_numpy(unit_float32(h))


_BELOW_ONE = numpy.float32(1.0 - 2.0 ** -24)  # the largest float32 below 1


def unit_float32(h: numpy.ndarray) -> numpy.ndarray:
    """uint64 hashes -> float32 in (0, 1): the top 24 bits, offset by half a step, so log(u) and ndtri(u) stay
    finite. The top step, (2^24 - 1/2) / 2^24, is not a float32 and rounds to 1.0 (ndtri(1) = inf: an infinite
    action); it becomes the largest float32 below 1 instead, every other value unchanged."""
    u = (h >> _S40).astype(numpy.float32)
    u += numpy.float32(0.5)
    u *= numpy.float32(1.0 / (1 << 24))
    numpy.minimum(u, _BELOW_ONE, out=u)
    return u


def counter_normal(seed: int, ids: torch.Tensor, counter: int | torch.Tensor, n: int) -> torch.Tensor:
    """Standard normal floats, shape [B, n], by the inverse CDF of `counter_uniform`."""
    return torch.special.ndtri(counter_uniform(seed, ids, counter, n))
