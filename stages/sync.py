"""Stage 2 — weight sync: the actor's new weights reach every rollout rank, versioned, at memory speed.

    rollout side (once):   receiver = WeightReceiver(model)          # allocates one shared buffer, binds params to it
                           handle = receiver.handle()                 # (name, size, layout, node): to the actor
    each sync:             sender.send(actor_model, [handles...], version)     # actor rank 0 writes every buffer
                           receiver.wait_for_version(version, timeout)         # each rollout rank checks the stamp

The rollout allocates its buffer once: one shared-memory segment holding every parameter and buffer of its model,
each at a 64-byte-aligned offset, plus a header whose first 8 bytes are the version stamp. On the CPU the rollout's
parameters *are* views into that segment, so the actor's copy lands directly in the weights the rollout infers with
(one memcpy per rollout rank, no serialization, no allocation). On a GPU (`stages/sync_gpu.py`) the parameters are
views of one flat device buffer: actor rank 0 on the same GPU writes it by CUDA IPC, device to device; from another
GPU it writes the pinned segment and the rollout loads it with one H2D copy. The actor writes the data first (and
waits for the device) and the stamp last, so a rollout that sees stamp v has every byte of version v. Only actor
rank 0 sends: data-parallel ranks hold identical weights.

Across nodes (Ray backend, cluster.num_nodes > 1) a rollout rank on another node than actor rank 0 cannot map its
buffer: the handle says which Ray node the buffer is on and carries a mailbox (a Ray channel transport keyed by the
buffer's name). Actor rank 0 sends a remote rank its weights through the mailbox (the object store), and the rank
copies them into its buffer; a same-node rank still gets the memcpy, then a notice through the mailbox (on Ray the
rollout waits on the mailbox instead of polling the stamp). Off Ray the handle has no mailbox and nothing changes.

The version is the runner's `global_step` when the weights were sent: the number of training steps behind them (one
training step holds many optimizer steps). The rollout tags every action with it, so every
trajectory says which weights produced it (`rollout/staleness` in the metrics is actor version minus that tag).

RLinf counterpart: `EmbodiedRunner.update_rollout_weights` calling `actor.sync_model_to_rollout()` and
`rollout.sync_model_from_actor()` together; `rlinf/hybrid_engines/weight_syncer/` (bucket and patch syncers, which
broadcast over NCCL or CUDA IPC). Left out: buckets and sparse patches (a shared buffer needs neither on one machine),
an NCCL broadcast to another GPU (the pinned host copy stands in), NCCL between machines (the object store carries
remote copies). Next stage: `stages/rollout.py`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from rlinf_mini.scheduler.shm import SharedSegment
from rlinf_mini.scheduler.tracer import span
from rlinf_mini.scheduler.worker import waiting_for_others
from stages.sync_gpu import GpuSender, GpuWeightReceiver
from stages.weight_buffer import (
    WRITING,
    TensorSlot,
    WeightBufferHandle,
    model_weights,
    plan_layout,
    read_newest,
    wait_for_stamp,
)

__all__ = ["TensorSlot", "WeightBufferHandle", "WeightReceiver", "WeightSender", "make_weight_receiver",
           "plan_layout"]  # the layout's names stay importable from here: tutorial 02 reads them in this file

_RAY_NODE = "RLINF_MINI_RAY_NODE"  # set by scheduler/ray_rank_actor.py in each rank: the Ray node id it runs on


def _ray_node_and_mailbox() -> tuple[str, Any]:
    """On the Ray backend, this rank's node id and the run's weight mailbox; ("", None) on one machine."""
    node = os.environ.get(_RAY_NODE, "")
    if not node:
        return "", None
    from rlinf_mini.scheduler.ray_channel import weights_mailbox

    return node, weights_mailbox()


class WeightReceiver:
    """The rollout's side: one shared buffer allocated at init; the model's weights live in (or load from) it."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        weights = model_weights(model)
        self.layout, size = plan_layout(weights)
        self.segment = SharedSegment.create(size, tag="weights")
        self._stamp = self.segment.view(torch.int64, (1,), 0)
        self._stamp.fill_(-1)
        self.version = -1
        self._noticed = -1  # async PPO on Ray: the newest version a mailbox message has named (_take_mailbox)
        self._views = {s.name: self.segment.view(s.dtype, s.shape, s.offset) for s in self.layout}
        self.zero_copy = all(t.device.type == "cpu" for t in weights.values())
        self.node, self.mailbox = _ray_node_and_mailbox()
        for name, t in weights.items():
            self._views[name].copy_(t.detach())
            if self.zero_copy:
                t.data = self._views[name]  # the parameter now aliases the shared buffer

    def handle(self) -> WeightBufferHandle:
        return WeightBufferHandle(self.segment.name, self.segment.size, self.layout, self.node, self.mailbox)

    def wait_for_version(self, version: int, timeout: float) -> float:
        """Block until the actor has stamped `version`; returns the seconds waited. Raises TimeoutError."""
        start = time.monotonic()
        with span("wait_weights"), waiting_for_others():  # the inline backend runs the actor meanwhile
            if self.mailbox is None:
                self._wait_stamp(version, timeout, start)
            else:
                self._wait_mailbox(version, timeout, start)
        if not self.zero_copy:
            with torch.no_grad(), span("weight_load"):
                for name, t in model_weights(self.model).items():
                    t.copy_(self._views[name], non_blocking=True)
        self.version = version
        return time.monotonic() - start

    def _wait_stamp(self, version: int, timeout: float, start: float) -> None:
        wait_for_stamp(self._stamp, version, timeout, start)

    def load_newest(self, model: torch.nn.Module, min_version: int, timeout: float) -> int:
        """Async PPO: copy the newest stamped version (>= min_version; waits for it) into `model`, a model apart from
        this buffer's (whose weights the actor may overwrite meanwhile); returns the version copied."""
        weights = model_weights(model)

        def copy_out() -> None:
            with torch.no_grad():
                for name, t in weights.items():
                    t.copy_(self._views[name])

        start = time.monotonic()
        with span("wait_weights"), waiting_for_others():  # the inline backend runs the actor meanwhile
            if self.mailbox is not None:
                self._take_mailbox(min_version, start + timeout, timeout)
            self.version = read_newest(self._stamp, copy_out, min_version, timeout - (time.monotonic() - start))
        return self.version

    def _take_mailbox(self, min_version: int, deadline: float, timeout: float) -> None:
        """Ray, async PPO: take every message the mailbox holds, and wait for more while none has said a version >=
        min_version. The newest weights sent from another node land in the buffer, stamped (this rank is then the
        buffer's only writer); a same-node notice says the actor has stamped that version in the buffer itself,
        which read_newest then copies torn-free."""
        sent_weights, weights_version = None, -1  # the newest weights a message carried
        while self.mailbox.qsize(self.segment.name) > 0 or max(self._noticed, int(self._stamp[0])) < min_version:
            ok, message = self.mailbox.get(self.segment.name, deadline, None, timeout)
            if not ok:
                raise TimeoutError(f"weight sync: version >= {min_version} did not arrive from actor rank 0 within "
                                   f"{timeout:g} s (buffer holds version {int(self._stamp[0])})")
            sent, weights = message
            self._noticed = max(self._noticed, sent)
            if weights is not None and sent > weights_version:
                sent_weights, weights_version = weights, sent
        if sent_weights is not None:
            with torch.no_grad(), span("weight_copy"):
                for name, t in sent_weights.items():
                    self._views[name].copy_(t)
            self._stamp.fill_(weights_version)

    def _wait_mailbox(self, version: int, timeout: float, start: float) -> None:
        """Ray: the actor's notice (a same-node buffer is written already) or the weights (from another node)."""
        ok, message = self.mailbox.get(self.segment.name, start + timeout, None, timeout)
        if not ok:
            raise TimeoutError(f"weight sync: version {version} did not arrive from actor rank 0 within {timeout:g} s "
                               f"(buffer holds version {int(self._stamp[0])})")
        sent, weights = message
        if weights is not None:
            with torch.no_grad(), span("weight_copy"):
                for name, t in weights.items():
                    self._views[name].copy_(t)
            self._stamp.fill_(sent)
        if int(self._stamp[0]) != version:
            raise RuntimeError(f"weight sync: waited for version {version}, actor rank 0 sent version {sent}")

    def close(self) -> None:
        self._views.clear()
        self._stamp = None
        self.segment.close()


class WeightSender:
    """The actor's side: attaches each rollout buffer once, then copies every tensor into it and stamps it."""

    def __init__(self):
        self._segments: dict[str, SharedSegment] = {}
        self._gpu = None  # stages/sync_gpu.py's GpuSender, made for the first rollout buffer on a GPU

    def send(self, model: torch.nn.Module, handles: list[WeightBufferHandle], version: int) -> int:
        """Write `model`'s weights into every rollout buffer, then the version stamp (or send them through the
        rank's mailbox when the buffer is on another node). Returns bytes written."""
        weights = model_weights(model)
        written = 0
        with torch.no_grad(), span("weight_send"):
            for h in handles:
                if [s.name for s in h.layout] != list(weights):
                    raise ValueError("weight sync: the rollout's model has different parameters than the actor's "
                                     "(are actor.model and rollout.model the same architecture?)")
                deadline = time.monotonic() + 60.0  # the mailbox is unbounded: a put does not wait
                if h.mailbox is not None and h.node != os.environ.get(_RAY_NODE, ""):  # another node
                    sent = {name: t.detach().cpu() for name, t in weights.items()}  # copied into the object store
                    h.mailbox.put(h.segment_name, (version, sent), deadline, None, 60.0)
                    written += sum(t.numel() * t.element_size() for t in sent.values())
                    continue
                seg = self._segments.get(h.segment_name)
                if seg is None:
                    seg = self._segments[h.segment_name] = SharedSegment.attach(h.segment_name, h.size)
                if h.gpu:  # the rollout's weights are on a GPU: CUDA IPC or the pinned host buffer (sync_gpu.py)
                    if self._gpu is None:
                        self._gpu = GpuSender()
                    written += self._gpu.send(weights, h, seg, version)
                    continue
                seg.view(torch.int64, (1,), 0).fill_(WRITING)  # first: a reader copying now will read again
                for slot in h.layout:
                    src = weights[slot.name].detach()
                    seg.view(slot.dtype, slot.shape, slot.offset).copy_(src)
                    written += src.numel() * src.element_size()
                seg.view(torch.int64, (1,), 0).fill_(version)  # last: the stamp publishes the complete version
                if h.mailbox is not None:  # a same-node rank on Ray waits on its mailbox, not on the stamp
                    h.mailbox.put(h.segment_name, (version, None), deadline, None, 60.0)
        return written

    def close(self) -> None:
        if self._gpu is not None:
            self._gpu.close()
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()


def make_weight_receiver(model: torch.nn.Module) -> WeightReceiver:
    """The receiver for where the rollout's model lives: the shared buffer on the CPU, a device buffer on a GPU."""
    if all(t.device.type == "cpu" for t in model_weights(model).values()):
        return WeightReceiver(model)
    return GpuWeightReceiver(model)
