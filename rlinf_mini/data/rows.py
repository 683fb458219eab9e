"""Rows of a prompt file: JSONL, JSON or parquet, each row a dict with where it is (for error messages).

    for where, row in read_rows("gsm8k.parquet", "data.train_data_paths"):   # ("row 1", {"question": ...}), ...

Formats by extension, as RLinf's ReasoningDataset reads them (`.jsonl`: one object per line; `.json`: a list of
objects, or one object), plus `.parquet` (one row per record: GSM8K's and veRL's files are parquet), read with
pyarrow, an optional extra (`pip install 'rlinf_mini[parquet]'`, ~170 MB installed) imported only for a parquet file.
Any unreadable input is a ValueError of one line naming the config key, the file and the line (or row): RLinf
raises "Load data error" for the whole file and skips unknown extensions with a log line; here they are refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

FORMATS = (".jsonl", ".json", ".parquet")


def _jsonl(path: Path, key: str) -> Iterator[tuple[str, object]]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue  # a blank line (often the last) is no row
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{key}: {path} line {n}: not valid JSON ({e})") from None
            yield f"line {n}", row


def _json(path: Path, key: str) -> Iterator[tuple[str, object]]:
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{key}: {path}: not valid JSON ({e})") from None
    for n, row in enumerate(content if isinstance(content, list) else [content], start=1):
        yield f"item {n}", row


def _parquet(path: Path, key: str) -> Iterator[tuple[str, object]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{key}: {path} is parquet, which needs pyarrow: pip install 'rlinf_mini[parquet]'"
                         ) from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises its own ArrowInvalid / OSError kinds for a damaged file
        raise ValueError(f"{key}: {path}: not a readable parquet file ({type(e).__name__}: {e})") from None
    for n, row in enumerate(table.to_pylist(), start=1):
        yield f"row {n}", row


def read_rows(path: str | Path, key: str) -> Iterator[tuple[str, dict]]:
    """(where: 'line 3' / 'item 3' / 'row 3', counted from 1, row) for each row; ValueError naming `key` and the
    file for a missing file, an unknown extension, a malformed line, a row that is not an object, or no rows."""
    path = Path(path)
    reader = {".jsonl": _jsonl, ".json": _json, ".parquet": _parquet}.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"{key}: {path}: unknown format {path.suffix!r} (known: {', '.join(FORMATS)})")
    if not path.is_file():
        raise ValueError(f"{key}: {path} does not exist")
    empty = True
    for where, row in reader(path, key):
        if not isinstance(row, dict):
            raise ValueError(f"{key}: {path} {where}: needs a JSON object, got {type(row).__name__}")
        empty = False
        yield where, row
    if empty:
        raise ValueError(f"{key}: {path} is empty (no rows)")
