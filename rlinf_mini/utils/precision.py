"""`actor.model.precision` / `rollout.model.precision` -> a torch.autocast context for the forward passes.

'bf16' on a GPU runs the forward (and so the backward) in bfloat16 autocast: matmuls in bf16, reductions such as
log_softmax in fp32, master weights and the optimizer state stay fp32 (RLinf's FSDP mixed precision keeps fp32
master weights too). '32' runs fp32. A CPU run never gets here with 'bf16': the driver refuses it before any worker
starts (rlinf_mini/train.py), since CPU bfloat16 matmuls are slower than fp32.
"""

from __future__ import annotations

import contextlib

import torch


def autocast(precision: str, device: torch.device):
    """The context to run a forward pass in: bf16 autocast on CUDA for 'bf16', else nothing."""
    if precision == "bf16" and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
