"""The benchmark table, as plain text or markdown: one row per `measure.Row`; a ratio reads "median [min-max]" over
the repetitions. Its own module so that `__main__` and
`gpu` both import it (gpu.py importing __main__ made an import circle)."""

from __future__ import annotations


def _num(x) -> str:
    if x is None:
        return "-"
    if x != x:  # NaN
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def format_table(rows: list, markdown: bool) -> str:
    header = ["benchmark", "unit", "ours", "baseline", "limit", "ratio", "target", "met", "note"]
    lines = []
    for r in rows:
        met = {True: "yes", False: "NO", None: ""}[r.met]
        base = f"{_num(r.baseline)} ({r.baseline_name})" if r.baseline is not None else "-"
        limit = f"{_num(r.limit)} ({r.limit_name})" if r.limit is not None else "-"
        ratio = f"{_num(r.ratio)} {r.ratio_of}" if r.ratio is not None else "-"
        if r.spread is not None:  # the median of the repetitions, then their range
            ratio = f"{_num(r.ratio)} [{_num(r.spread[0])}-{_num(r.spread[1])}] {r.ratio_of}"
        lines.append([r.name, r.unit, _num(r.ours), base, limit, ratio, r.target, met, r.note])
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, lines)])
