"""Process bodies for tests/test_gpu.py (a module, so that spawned processes can import them by name)."""

from __future__ import annotations

import os

import torch


class SmallModel(torch.nn.Module):
    """Two parameters and an integer buffer: weight [256, 300] float32 (307 KB, above the channel's shm threshold),
    bias [256], steps [1] int64."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(256, 300))
        self.bias = torch.nn.Parameter(torch.zeros(256))
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))


def gpu_weight_receiver(versions: int, handle_q, out_q, timeout_s: float) -> None:
    """A rollout rank on cuda:0: offer the buffer's handle, then report each received version's weights."""
    from stages.sync import make_weight_receiver

    model = SmallModel().cuda()
    receiver = make_weight_receiver(model)
    handle_q.put(receiver.handle())
    try:
        for v in range(versions):
            receiver.wait_for_version(v, timeout=timeout_s)
            out_q.put((v, {k: t.detach().cpu().clone() for k, t in model.state_dict().items()}))
    finally:
        receiver.close()


def gpu_collective_rank(rank: int, port: int, out_q, timeout_s: float) -> None:
    """One of two ranks on the same GPU: all-reduce a CUDA tensor; report the backend and the sum."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "2"})
    from rlinf_mini.scheduler.collective import TorchDistCollective

    coll = TorchDistCollective(rank, 2, torch.device("cuda:0"), timeout_s)
    try:
        t = torch.full((4,), float(rank + 1), device="cuda")
        coll.all_reduce(t)
        out_q.put((rank, coll.backend, t.cpu()))
    finally:
        coll.close()
