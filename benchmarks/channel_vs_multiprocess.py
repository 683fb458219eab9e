"""Why rlinf_mini does not use `multiprocess` (dill): it pickles tensors by copy. Side by side, one run:
a 64x3x64x64 uint8 batch (786 KB) from one process to another through multiprocess.Queue, through our Channel (a
ready tensor, copied by each put; and each batch built in `Channel.empty`, put without a copy), and the memcpy limit.
Writes JSON with --out. (`python -m benchmarks --only channel` is the measured row: median of interleaved rounds.)

    pip install multiprocess && python -m benchmarks.channel_vs_multiprocess [--n 200] [--out results/x.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from pathlib import Path

import torch

from rlinf_mini.scheduler.channel import Channel
from rlinf_mini.scheduler.local import ChannelServer, KernelQueues

BATCH = (64, 3, 64, 64)


def _produce_queue(q, n: int) -> None:
    x = torch.randint(0, 255, BATCH, dtype=torch.uint8)
    for _ in range(n):
        q.put(x)


def _produce_channel(ch: Channel, n: int) -> None:
    torch.set_num_threads(1)
    x = torch.randint(0, 255, BATCH, dtype=torch.uint8)
    for _ in range(n):
        ch.put(x, key=0)


def _produce_channel_in_place(ch: Channel, n: int) -> None:
    """Each batch built in a lent shared segment with one copy from a source frame, then put by name."""
    torch.set_num_threads(1)
    x = torch.randint(0, 255, BATCH, dtype=torch.uint8)
    for _ in range(n):
        buf = ch.empty(BATCH, torch.uint8)
        buf.copy_(x)
        ch.put(buf, key=0)


def _receive(get, n: int) -> float:
    """GB/s over n-1 messages (the first one pays the producer's start-up)."""
    get()
    start = time.perf_counter()
    for _ in range(n - 1):
        get()
    return torch.tensor(BATCH).prod().item() * (n - 1) / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {}
    try:
        import multiprocess

        q = multiprocess.get_context("spawn").Queue(4)
        p = multiprocess.get_context("spawn").Process(target=_produce_queue, args=(q, args.n))
        p.start()
        rows["multiprocess.Queue (dill)"] = _receive(q.get, args.n)
        p.join()
    except ImportError:
        print("multiprocess is not installed: its row is skipped")
    server = ChannelServer()
    for name, producer in (("rlinf_mini Channel", _produce_channel),
                           ("rlinf_mini Channel, built in place", _produce_channel_in_place)):
        server.create(name, 4)
        ch = Channel(name, KernelQueues(name, server.address, server.authkey, 30.0), 30.0)
        p = multiprocessing.get_context("spawn").Process(target=producer, args=(ch, args.n))
        p.start()
        rows[name] = _receive(lambda ch=ch: ch.get(key=0), args.n)
        p.join()
    server.close()
    a, b = torch.empty(BATCH, dtype=torch.uint8), torch.empty(BATCH, dtype=torch.uint8)
    start = time.perf_counter()
    for _ in range(2000):
        a.copy_(b)
    rows["memcpy (limit)"] = a.numel() * 2000 / (time.perf_counter() - start) / 1e9
    limit = rows["memcpy (limit)"]
    print(f"{'transport':36s} {'GB/s':>8s} {'x memcpy':>9s}")
    for name, gbps in rows.items():
        print(f"{name:36s} {gbps:8.2f} {gbps / limit:9.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
