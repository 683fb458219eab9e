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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("RLINF_MINI_TUTORIAL_OUT", ROOT / "tutorials" / "_out"))
OUT.mkdir(parents=True, exist_ok=True)

# Worker processes start from a fork server that, like "spawn", re-runs the parent's main *script* in every child
# unless it sits under `if __name__ == "__main__":`. A tutorial is a script without that guard (so that it reads as a
# notebook); without a __file__ its __main__ looks like a notebook's, and the children import only what they need.
_main = sys.modules.get("__main__")
if _main is not None and Path(getattr(_main, "__file__", "/")).resolve().parent == ROOT / "tutorials":
    del _main.__file__


def _first_difference(got, want, atol: float, where: str = "") -> str | None:
    """None if `got` equals `want` (tensors: allclose within atol), else one line naming the first place that differs:
    a tensor's first differing index with both values, a shape, a length, or a type."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{where or 'the result'} is a {type(got).__name__}, expected a tensor of shape {tuple(want.shape)}"
        if got.shape != want.shape:
            return f"{where or 'the result'} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        bad = ~torch.isclose(got.double(), want.double(), atol=atol, rtol=0)
        if not bad.any():
            return None
        index = tuple(int(i) for i in bad.nonzero()[0])  # the first in row-major order
        return (f"{where or 'the result'}[{', '.join(map(str, index))}] = {got[index].item():.6g}, expected "
                f"{want[index].item():.6g} ({int(bad.sum())} of {bad.numel()} elements differ)")
    if isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            size = len(got) if isinstance(got, (tuple, list)) else type(got).__name__
            return f"{where or 'the result'} has {size} items, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if (diff := _first_difference(g, w, atol, f"{where or 'the result'}[{i}]")) is not None:
                return diff
        return None
    if isinstance(want, float):
        same = isinstance(got, (int, float)) and abs(got - want) <= atol
    else:
        same = got == want
    return None if same else f"{where or 'the result'} = {got!r}, expected {want!r}"


def _describe(value) -> str:
    """A case's input in one short line: tensors by shape and first values, configs by their class."""
    if isinstance(value, torch.Tensor):
        head = ", ".join(f"{v:.4g}" for v in value.flatten()[:6].tolist())
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{dtype}{list(value.shape)}({head}{', ...' if value.numel() > 6 else ''})"  # float32[8, 4](0.1, ...)
    if isinstance(value, (tuple, list)) and len(value) <= 8:
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    if isinstance(value, Mapping) and all(isinstance(v, torch.Tensor) for v in value.values()):  # a state dict
        items = [f"{k}: {str(v.dtype).removeprefix('torch.')}{list(v.shape)}" for k, v in list(value.items())[:4]]
        return "{" + ", ".join(items) + (f", ... ({len(value)} tensors)" if len(value) > 4 else "") + "}"
    text = repr(value)
    return text if len(text) <= 80 else f"{type(value).__name__}(...)"


def _named(cases: Sequence[tuple] | Mapping[str, tuple]) -> list[tuple[str, tuple]]:
    if isinstance(cases, Mapping):
        return list(cases.items())
    return [(f"case {i}", case) for i, case in enumerate(cases)]


def matches(yours: Callable, reference: Callable, cases: Sequence[tuple] | Mapping[str, tuple],
            atol: float = 1e-5) -> bool:
    """True if `yours(*case)` equals `reference(*case)` (tensors: allclose within atol) for every case."""
    return all(_first_difference(yours(*case), reference(*case), atol) is None for _, case in _named(cases))


def check_exercise(yours: Callable, reference: Callable, cases: Sequence[tuple] | Mapping[str, tuple],
                   atol: float = 1e-5) -> None:
    """Compare the learner's function with the reference on every case (a list, or a dict of named cases); raise
    AssertionError at the first that differs, naming the case, its inputs and the first index that differs; else print
    how many cases matched (and whether the body is still the shipped reference call)."""
    named = _named(cases)
    for name, case in named:
        got, want = yours(*case), reference(*case)
        if (diff := _first_difference(got, want, atol)) is not None:
            inputs = ", ".join(_describe(v) for v in case)
            raise AssertionError(f"exercise {yours.__name__}: {name} differs from the reference: {diff}\n"
                                 f"  inputs: {inputs}")
    try:
        shipped = reference.__name__ in inspect.getsource(yours)
    except (OSError, TypeError):
        shipped = False
    note = " (its body still calls the reference: replace it with your own)" if shipped else ""
    print(f"exercise {yours.__name__}: matches the reference on {len(named)} cases{note}")
