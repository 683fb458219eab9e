"""The adaptive spin of the local channels (cluster.channel_wait: 'spin'): before a get (or a put on a full key)
sleeps in poll(), it retries the non-blocking call for up to SPIN_S.

Waking a process that sleeps in poll() takes a sizeable part of one small-model inference, so when the other side
runs on another core, its message mostly comes within the spin. When the other side needs this core to make the
message, spinning only delays it: after SPIN_MISSES spins in a row that caught nothing, this process stops spinning
and tries once every SPIN_RETRY waits. The plain path (cluster.channel_wait: 'block', kernel_queues.py) goes to
poll() at once; both deliver the same messages in the same order (tests/test_channel.py), only the wake-up differs.
What the spin does to embodied_mlp's end-to-end row: docs/performance.md.
"""

from __future__ import annotations

import socket
import time

SPIN_S = 100e-6
SPIN_MISSES = 8
SPIN_RETRY = 64
_state = {"misses": 0, "skipped": 0}  # this process's (threads share it: a race only shifts when it retries)


def spin_for(op, arg):
    """`op(arg, MSG_DONTWAIT)`'s result if it succeeds within SPIN_S of polling, else BlockingIOError."""
    if _state["misses"] >= SPIN_MISSES:
        _state["skipped"] += 1
        if _state["skipped"] < SPIN_RETRY:
            raise BlockingIOError
        _state["skipped"] = 0  # one try, which resumes spinning if it catches the message
    end = time.perf_counter() + SPIN_S
    while time.perf_counter() < end:
        try:
            value = op(arg, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        _state["misses"] = 0
        return value
    _state["misses"] += 1
    raise BlockingIOError
