"""HF math-verify's verdict with a timeout that always holds: in the main thread math-verify's own SIGALRM timeout;
elsewhere (an inline-backend rank is a thread, and signals need the main thread) in a one-process pool whose
process is killed and replaced when a call runs past its bound. A timeout or an error is a wrong answer, never a
hang or a raise. Imports nothing heavy: the pool's spawned process loads only this module and math-verify.

    math_verify_equal("\\frac{1}{2}", ["0.5"])    # True
Used by `stages/reasoning_reward.py` (reward.verifier: math_verify; the [math] extra).
"""

from __future__ import annotations

import atexit
import multiprocessing
import threading

TIMEOUT_S = 5  # math-verify's own default, for each parse and each comparison
_pool = None  # the one-process pool of non-main threads (created on first use)
_pool_lock = threading.Lock()


def judge(response: str, references: list[str], timeout_s: int | None) -> bool:
    """math-verify: parse the response and each reference (one without $ or \\boxed is read as LaTeX math),
    then compare them."""
    from math_verify import parse, verify

    answer = parse(response, parsing_timeout=timeout_s)
    return any(verify(parse(ref if "$" in ref or "\\boxed" in ref else f"${ref}$", parsing_timeout=timeout_s), answer,
                      timeout_seconds=timeout_s) for ref in references)


def close_pool() -> None:
    """Kill the pool's process, if any (the reward worker's close, atexit, a timeout)."""
    global _pool
    if _pool is not None:
        _pool.terminate()
        _pool = None


def math_verify_equal(response: str, references: list[str], timeout_s: int = TIMEOUT_S) -> bool:
    """The verdict, or False when it takes longer than its bound (main thread: timeout_s per parse and compare;
    elsewhere: the pool's call as a whole gets 2 + 2 x references bounds, plus the first call's process start)."""
    if threading.current_thread() is threading.main_thread():
        return judge(response, references, timeout_s)
    global _pool
    with _pool_lock:  # one call at a time in the pool; a killed process takes only its own call with it
        first = _pool is None
        if first:
            _pool = multiprocessing.get_context("spawn").Pool(1)
            atexit.register(close_pool)
        call = _pool.apply_async(judge, (response, references, timeout_s))
        try:
            return bool(call.get(timeout=timeout_s * (2 + 2 * len(references)) + (30 if first else 0)))
        except multiprocessing.TimeoutError:
            close_pool()  # the stuck process is killed; the next call starts a fresh one
            return False
        except Exception:  # noqa: BLE001  (math-verify's errors are a wrong answer)
            return False
