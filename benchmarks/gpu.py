"""The GPU figures: weight sync and the channel with CUDA tensors against the device's copy bandwidth, and the full
runner with the policy on the GPU. About 3 minutes on one GPU; without a GPU it says so and exits 0.

    bash benchmarks/gpu.sh                       # = python -m benchmarks --device cuda
    python -m benchmarks --device cuda --quick   # smaller counts

Limits, measured here on the same device: device-to-device copy (torch copy_ between two CUDA tensors) and
host-to-device copy from pinned memory. Weight sync on a GPU (stages/sync.py) is a device-to-device copy by CUDA IPC
when the rollout is on actor rank 0's GPU, else D2H into the rollout's pinned shared buffer, then H2D; both paths are
measured here on one GPU (the second by relabelling the rollout's GPU). The channel copies a CUDA tensor from the
device straight into shared memory (one copy); the consumer moves it to its GPU.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path


def _copy_gbps(src, dst, reps: int) -> float:
    import torch

    dst.copy_(src)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return src.numel() * src.element_size() / best / 1e9


def weight_sync_gpu(h, numel: int, reps: int, path: str) -> list:
    """Weight sync into a rollout process on the same GPU, by `path`: 'cuda ipc' (the handle as the rollout made it)
    or 'pinned host copy' (the handle relabelled as if the rollout were on another GPU: D2H, then H2D)."""
    import dataclasses

    import torch

    from benchmarks import bench_workers as bw
    from benchmarks.measure import Row
    from stages.sync import WeightSender

    nbytes = numel * 4
    h.submit(1, "weight_receiver", numel, reps + 1, "@handle_q", "@ack_q", "cuda")
    handle = h.shared["handle_q"].get(timeout=300)
    if path == "pinned host copy":
        handle = dataclasses.replace(handle, gpu="GPU-elsewhere")
    model = bw.FlatModel(numel, "cuda")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    sender, times = WeightSender(), []
    assert sender._gpu.path(dict(model.state_dict(keep_vars=True)), handle) == path
    for v in range(reps + 1):
        start = time.perf_counter()
        sender.send(model, [handle], v)
        h.shared["ack_q"].get(timeout=300)  # the rollout has version v on its GPU
        times.append(time.perf_counter() - start)
    sender.close()
    h.result(1)
    ours = nbytes / min(times[1:]) / 1e9
    a, b = torch.ones(numel, device="cuda"), torch.empty(numel, device="cuda")
    d2d = _copy_gbps(a, b, 5)
    h2d = _copy_gbps(torch.ones(numel).pin_memory(), b, 3)
    del model, a, b
    torch.cuda.empty_cache()
    return [Row(f"GPU weight sync ({path}), {numel / 1e6:g}M float32 ({nbytes / 1e6:.0f} MB)", "GB/s", ours, h2d,
                "H2D pinned", d2d, "D2D copy", ours / d2d, "ours/limit",
                note=f"ours/H2D pinned = {ours / h2d:.2f}; includes the rollout's wake-up and ack")]


def pinned_vs_pageable(numel: int) -> list:
    """Host-to-device bandwidth from pinned and from pageable memory: what pinning the shared buffer buys."""
    import torch

    from benchmarks.measure import Row

    dst = torch.empty(numel, device="cuda")
    pinned = _copy_gbps(torch.ones(numel).pin_memory(), dst, 5)
    pageable = _copy_gbps(torch.ones(numel), dst, 5)
    d2d = _copy_gbps(torch.ones(numel, device="cuda"), dst, 5)
    return [Row(f"H2D pinned vs pageable, {numel * 4 / 1e6:.0f} MB", "GB/s", pinned, pageable, "pageable", d2d,
                "D2D copy", pinned / pageable, "pinned/pageable")]


def channel_gpu(h, n: int) -> list:
    import torch

    from benchmarks.measure import Row

    nbytes = 64 * 3 * 64 * 64
    ch = h.channel(maxsize=4)
    _, seconds = h.both(("channel_producer_cuda", ch, n), ("channel_consumer_cuda", ch, n))
    ours = nbytes * (n - 1) / seconds / 1e9
    a = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    d2d = _copy_gbps(a, torch.empty_like(a), 50)
    h2d = _copy_gbps(torch.ones(nbytes, dtype=torch.uint8), a, 50)
    return [Row("GPU channel, large CUDA tensors (786 KB)", "GB/s", ours, h2d, "H2D pageable", d2d, "D2D copy",
                ours / d2d, "ours/limit", note="producer D2H straight into shm, consumer .cuda(); no CUDA IPC")]


def main(out: Path, quick: bool = False) -> int:
    try:
        import torch
    except ImportError:
        print("benchmarks --device cuda: torch is not installed; skipped")
        return 0
    if not torch.cuda.is_available():
        print("benchmarks --device cuda: no CUDA GPU visible; skipped (nothing measured)")
        return 0
    from benchmarks import measure as m
    from benchmarks.table import format_table

    start = time.monotonic()
    rows = []
    hosts = m.Hosts()
    try:
        rows += channel_gpu(hosts, 100 if quick else 300)
        for numel, reps in ([(10_000_000, 3)] if quick else [(10_000_000, 5), (100_000_000, 3)]):
            for path in ("cuda ipc", "pinned host copy"):
                rows += weight_sync_gpu(hosts, numel, reps, path)
        rows += pinned_vs_pageable(25_000_000)
    finally:
        hosts.close()
    # The full runner: the Cluster sees the GPU, so rollout and actor run on cuda:0. The disaggregated config has one
    # actor rank (embodied_mlp.yaml's two would put two NCCL ranks on one GPU, which NCCL refuses).
    rows += [dataclass_renamed(r, "GPU " + r.name)
             for r in m.runner_and_tracing(3 if quick else 5, "configs/embodied_disaggregated.yaml")]
    print(format_table(rows, markdown=False))
    print()
    print(format_table(rows, markdown=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    import dataclasses

    report = {"device": torch.cuda.get_device_name(0), "seconds": time.monotonic() - start,
              "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                          "torch": torch.__version__},
              "rows": [dataclasses.asdict(r) | {"met": r.met} for r in rows]}
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out} ({report['seconds']:.0f} s)")
    return 0


def dataclass_renamed(row, name: str):
    import dataclasses

    return dataclasses.replace(row, name=name)


if __name__ == "__main__":
    sys.exit(main(Path("results/benchmarks_gpu.json"), quick="--quick" in sys.argv))
