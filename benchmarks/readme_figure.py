"""The README's picture: a run's learning curve and its pipelined step's timeline, side by side.

    python -m rlinf_mini.train --config configs/embodied.yaml       # the README's train command
    python -m benchmarks.readme_figure --run-dir results/embodied  # -> docs/img/readme.png

Both halves are the PNGs the run itself wrote into its folder (learning_curve.png at the end of training, timeline.png
of the last traced step); this only scales them to one height and puts them next to each other.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from PIL import Image

HEIGHT = 340  # pixels: the learning curve's own height at dpi 100


def side_by_side(left: Path, right: Path, out: Path) -> Path:
    images = [Image.open(p).convert("RGB") for p in (left, right)]
    images = [im.resize((round(im.width * HEIGHT / im.height), HEIGHT), Image.LANCZOS) for im in images]
    canvas = Image.new("RGB", (sum(im.width for im in images), HEIGHT), "white")
    x = 0
    for im in images:
        canvas.paste(im, (x, 0))
        x += im.width
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out, optimize=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path("results/embodied"))
    parser.add_argument("--out", type=Path, default=Path("docs/img/readme.png"))
    args = parser.parse_args(argv)
    missing = [p for p in ("learning_curve.png", "timeline.png") if not (args.run_dir / p).is_file()]
    if missing:
        raise SystemExit(f"error: {args.run_dir}: no {', '.join(missing)} (run the train command to its end first)")
    print(side_by_side(args.run_dir / "learning_curve.png", args.run_dir / "timeline.png", args.out))


if __name__ == "__main__":
    main()
