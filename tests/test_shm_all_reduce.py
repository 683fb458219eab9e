"""cluster.all_reduce 'shm' (rlinf_mini/scheduler/shm_all_reduce.py): the sums against a plain loop over the ranks'
tensors, through the segment's growth and its two alternating buffers, a missing rank as a timeout naming it, and no
segment left behind. Ranks are threads here (each maps the segment itself, as a process does); the processes of a
real run are tested end to end in tests/test_backends.py (shm against gloo, bitwise the same training)."""

from __future__ import annotations

import secrets
import threading

import pytest
import torch

from rlinf_mini.scheduler import shm, shm_all_reduce
from rlinf_mini.scheduler.collective import CollectiveTimeout

pytestmark = pytest.mark.skipif(not shm_all_reduce.supported(), reason="the shm all-reduce is x86-64 only")


def run_ranks(world: int, fn, timeout_s: float = 30.0):
    """fn(rank, collective) on `world` threads; returns their results by rank (re-raising a rank's exception)."""
    base = f"{shm.PREFIX}{shm.run_id()}_test_{secrets.token_hex(4)}"
    barrier = threading.Barrier(world)
    results, errors = [None] * world, []

    def body(rank: int) -> None:
        c = shm_all_reduce.ShmAllReduce(rank, world, base, timeout_s, lambda: barrier.wait(timeout_s))
        try:
            results[rank] = fn(rank, c)
        except BaseException as e:  # noqa: BLE001  (re-raised in the test's thread)
            errors.append(e)
            barrier.abort()
        finally:
            c.close()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 10)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    assert not list(shm.SHM_DIR.glob(f"{base}*")), "a segment outlived its collective"
    return results


def inputs(rank: int, call: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank * 1000 + call)
    if dtype == torch.int64:
        return torch.randint(-1000, 1000, (numel,), generator=g)
    return torch.randn(numel, generator=g).to(dtype)


# (numel, dtype) per call: small, then large enough to grow the segment twice, back to small, an int64 count
CALLS = [(3, torch.float32), (5000, torch.float32), (80_000, torch.float32), (2, torch.float64), (7, torch.int64),
         (0, torch.float32), (80_000, torch.float32), (1, torch.float32)] * 3


@pytest.mark.parametrize("world", [2, 3])
def test_the_sums_are_the_ranks_tensors_added_in_rank_order_at_every_call(world):
    def fn(rank, c):
        out = []
        for call, (numel, dtype) in enumerate(CALLS):
            t = inputs(rank, call, numel, dtype).view(-1, 1) if numel % 2 else inputs(rank, call, numel, dtype)
            assert c.accepts(t)
            out.append(c.all_reduce(t).reshape(-1).clone())
        return out

    got = run_ranks(world, fn)
    for call, (numel, dtype) in enumerate(CALLS):
        expect = inputs(0, call, numel, dtype)
        for r in range(1, world):
            expect = expect + inputs(r, call, numel, dtype)  # the plain loop: rank order, as gloo does with 2
        for r in range(world):
            assert got[r][call].dtype == dtype and torch.equal(got[r][call], expect), (call, r)


def test_a_rank_that_never_comes_is_a_timeout_naming_it():
    def fn(rank, c):
        if rank == 0:
            c.all_reduce(torch.ones(4))  # grows (both ranks meet at the barrier), then waits for rank 1's post
        else:
            c._grow(16)  # rank 1 joins the segment but never makes the call
        return rank

    with pytest.raises(CollectiveTimeout, match=r"shm all_reduce of \(4,\) did not complete within 0.5 s "
                                                r"\(cluster.timeout_s\): rank\(s\) \[1\] of the group never reached "
                                                r"call 1"):
        run_ranks(2, fn, timeout_s=0.5)


def test_only_cpu_float_and_int64_tensors_take_the_segment():
    assert shm_all_reduce.ShmAllReduce.accepts(torch.zeros(2, dtype=torch.bfloat16))
    assert not shm_all_reduce.ShmAllReduce.accepts(torch.zeros(2, dtype=torch.bool))
    assert not shm_all_reduce.ShmAllReduce.accepts(torch.zeros(2, dtype=torch.int32))
