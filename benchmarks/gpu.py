"""The GPU figures: weight sync and the channel with CUDA tensors against the device's copy bandwidth, and the full
runner with the policy on the GPU. About 3 minutes on one GPU; without a GPU it says so and exits 0.

    bash benchmarks/gpu.sh                       # = python -m benchmarks --device cuda
    python -m benchmarks --device cuda --quick   # smaller counts

Limits, measured here on the same device: device-to-device copy (torch copy_ between two CUDA tensors) and
host-to-device copy from pageable memory (what a CUDA tensor crossing a process boundary through host shared memory
pays at least twice: device -> shared host buffer -> device). Weight sync on a GPU machine is D2H into the rollout's
shared buffer, then H2D into its parameters (stages/sync.py); CUDA IPC would skip the host and is the next step.
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


def weight_sync_gpu(h, numel: int, reps: int) -> list:
    import torch

    from benchmarks import bench_workers as bw
    from benchmarks.measure import Row
    from stages.sync import WeightSender

    nbytes = numel * 4
    h.submit(1, "weight_receiver", numel, reps + 1, "@handle_q", "@ack_q", "cuda")
    handle = h.shared["handle_q"].get(timeout=300)
    model = bw.FlatModel(numel, "cuda")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    sender, times = WeightSender(), []
    for v in range(reps + 1):
        start = time.perf_counter()
        sender.send(model, [handle], v)
        h.shared["ack_q"].get(timeout=300)  # the rollout copied version v onto its GPU
        times.append(time.perf_counter() - start)
    sender.close()
    h.result(1)
    ours = nbytes / min(times[1:]) / 1e9
    a, b = torch.ones(numel, device="cuda"), torch.empty(numel, device="cuda")
    d2d = _copy_gbps(a, b, 5)
    h2d = _copy_gbps(torch.ones(numel), b, 3)
    del model, a, b
    torch.cuda.empty_cache()
    return [Row(f"GPU weight sync, {numel / 1e6:g}M float32 ({nbytes / 1e6:.0f} MB)", "GB/s", ours, h2d,
                "H2D pageable", d2d, "D2D copy", ours / d2d, "ours/limit",
                note=f"ours/H2D = {ours / h2d:.2f}; D2H + H2D through host shared memory")]


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
                ours / d2d, "ours/limit", note="producer .cpu() into shm, consumer .cuda(); no CUDA IPC yet")]


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
            rows += weight_sync_gpu(hosts, numel, reps)
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
