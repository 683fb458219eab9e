"""What every tutorial imports first: the repository on sys.path, the folder for its pictures and runs, and the
exercise check.

    from workbench import ROOT, OUT, check_exercise, matches

ROOT is the repository (so `python tutorials/01_placement.py` and a notebook opened in tutorials/ both find `stages`
and `configs/`). OUT is where tutorials write pictures and run folders: $RLINF_MINI_TUTORIAL_OUT, or tutorials/_out/
(ignored by git; the tests point it at a temporary folder and remove it).

Exercises: each tutorial has one function marked `# EXERCISE`, whose body as shipped calls the reference answer (the
real function in stages/), so the tutorial runs green in CI. Replace the body with your own code and run the
tutorial again: `check_exercise` compares your function with the reference on the tutorial's cases and stops with the
first case that differs.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("RLINF_MINI_TUTORIAL_OUT", ROOT / "tutorials" / "_out"))
OUT.mkdir(parents=True, exist_ok=True)

# Worker processes are started with "spawn", which re-runs the parent's main *script* in every child unless it sits
# under `if __name__ == "__main__":`. A tutorial is a script without that guard (so that it reads as a notebook);
# without a __file__ its __main__ looks like a notebook's, and the children import only the modules they need.
_main = sys.modules.get("__main__")
if _main is not None and Path(getattr(_main, "__file__", "/")).resolve().parent == ROOT / "tutorials":
    del _main.__file__


def _same(got, want, atol: float) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(
            got.double(), want.double(), atol=atol, rtol=0)
    if isinstance(want, (tuple, list)):
        return isinstance(got, (tuple, list)) and len(got) == len(want) and all(
            _same(g, w, atol) for g, w in zip(got, want, strict=True))
    if isinstance(want, float):
        return isinstance(got, (int, float)) and abs(got - want) <= atol
    return got == want


def matches(yours: Callable, reference: Callable, cases: Sequence[tuple], atol: float = 1e-5) -> bool:
    """True if `yours(*case)` equals `reference(*case)` (tensors: allclose within atol) for every case."""
    return all(_same(yours(*case), reference(*case), atol) for case in cases)


def check_exercise(yours: Callable, reference: Callable, cases: Sequence[tuple], atol: float = 1e-5) -> None:
    """Compare the learner's function with the reference on every case; raise AssertionError at the first that
    differs, else print how many cases matched (and whether the body is still the shipped reference call)."""
    for i, case in enumerate(cases):
        got, want = yours(*case), reference(*case)
        if not _same(got, want, atol):
            raise AssertionError(f"exercise {yours.__name__}: case {i} differs from the reference\n"
                                 f"  yours:    {got}\n  expected: {want}")
    try:
        shipped = reference.__name__ in inspect.getsource(yours)
    except (OSError, TypeError):
        shipped = False
    note = " (its body still calls the reference: replace it with your own)" if shipped else ""
    print(f"exercise {yours.__name__}: matches the reference on {len(cases)} cases{note}")
