"""The console of a run: a progress bar on a terminal only; off one (a log file, nohup, CI) one clean line per
runner.log_interval steps and per eval, and no warning."""

from __future__ import annotations

import io
import subprocess
import sys

from conftest import ROOT

from rlinf_mini.runners.base import progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_only_when_wanted_and_on_a_terminal():
    assert progress_bar(True, 10, 0, io.StringIO()) is None  # a pipe or a file
    assert progress_bar(False, 10, 0, Terminal()) is None  # runner.progress_bar: false
    bar = progress_bar(True, 10, 3, Terminal())
    try:
        assert bar is not None and (bar.total, bar.n) == (10, 3)
    finally:
        bar.close()


def test_a_run_logged_to_a_pipe_prints_one_clean_line_per_step_and_no_warning(tmp_path):
    run = subprocess.run([sys.executable, "-m", "rlinf_mini.train", "--config", "configs/embodied_mlp.yaml",
                          "runner.max_epochs=3", "runner.val_check_interval=3", "runner.logger.logger_backends=[]",
                          f"runner.logger.log_path={tmp_path}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = run.stdout + run.stderr
    assert "\r" not in printed and "warning" not in printed.lower(), printed
    steps = [line for line in run.stderr.splitlines() if line.startswith("step ")]
    assert len(steps) == 4, run.stderr  # the eval before training (step 0), then steps 1, 2 and 3
