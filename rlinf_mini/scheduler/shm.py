"""Named shared-memory segments, owned by one run and swept when it ends.

A segment is a file in /dev/shm mapped into every process that opens it by name, so a tensor written there by one
worker is read by another at memory speed. We use plain files (not `multiprocessing.shared_memory`) because Python
3.11's resource tracker unlinks segments when *any* attaching process exits, and warns about the rest. Every name
starts with `rlmini_<run_id>_`, so the driver can remove all of a run's segments at shutdown, after a crash of a
worker, or at Ctrl-C: `sweep(run_id)`. A run id starts with its driver's pid, so the next run removes what a run whose
driver was killed (kill -9: no cleanup ran) left behind: `sweep_dead_runs()`. A segment's memory is reserved when it
is created (posix_fallocate), so a full /dev/shm (Docker's default is 64 MB) is a `ShmFullError` naming the size and
the fix at that moment, never a SIGBUS when a page is first touched later.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import secrets
import tempfile
from pathlib import Path

import torch

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
PREFIX = "rlmini_"
_counter = itertools.count()


class ShmFullError(OSError):
    """/dev/shm cannot hold a segment: one line naming the folder, the bytes needed and free, and the fix."""

    def __init__(self, need: int, what: str, folder: Path | None = None):
        folder = SHM_DIR if folder is None else folder
        free = free_bytes(folder)
        super().__init__(f"{folder} is too small for {what}: needs {_mb(need)}, {_mb(free)} free; give it more "
                         f"(docker run --shm-size=4g ..., or remount it larger) and check with `df -h {folder}`")
        self.need, self.free = need, free

    @classmethod
    def find_in(cls, text: str) -> str | None:
        """The ShmFullError line of a worker's traceback, if there is one."""
        prefix = f"{__name__}.{cls.__name__}: "
        for line in text.splitlines():
            if line.startswith(prefix):
                return line.removeprefix(prefix)
        return None


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def free_bytes(folder: Path = SHM_DIR) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def check_free(need: int, what: str, folder: Path | None = None) -> None:
    """Raise ShmFullError when `folder` (/dev/shm) has less than `need` bytes free: the driver's check before any
    worker starts (a segment's own reservation is the guarantee; this makes the common case fail first)."""
    folder = SHM_DIR if folder is None else folder
    if free_bytes(folder) < need:
        raise ShmFullError(need, what, folder)


def new_run_id() -> str:
    """'<driver pid>-<4 hex digits>': unique among runs, and it names the process whose death orphans the run."""
    return f"{os.getpid()}-{secrets.token_hex(2)}"


def run_id() -> str:
    """The current run's id: set by the driver (Cluster) in every worker's environment."""
    return os.environ.get("RLINF_MINI_RUN_ID", f"{os.getpid()}-solo")


class SharedSegment:
    """A named block of shared memory, viewed as a uint8 tensor `self.data` of `size` bytes."""

    def __init__(self, name: str, size: int, create: bool):
        self.name, self.size, self.owner = name, size, create
        path = SHM_DIR / name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
                _reserve(fd, size, name)
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)  # the mapping keeps the memory alive
        self.data = torch.frombuffer(self._mmap, dtype=torch.uint8, count=size)  # [size] bytes

    @classmethod
    def create(cls, size: int, tag: str = "seg") -> SharedSegment:
        return cls(f"{PREFIX}{run_id()}_{tag}_{os.getpid()}_{next(_counter)}", size, create=True)

    @classmethod
    def attach(cls, name: str, size: int) -> SharedSegment:
        return cls(name, size, create=False)

    def view(self, dtype: torch.dtype, shape: tuple[int, ...], offset: int = 0) -> torch.Tensor:
        """A tensor of `shape` and `dtype` that aliases the segment's bytes from `offset` (a multiple of 64)."""
        numel = 1
        for s in shape:
            numel *= s
        return torch.frombuffer(self._mmap, dtype=dtype, count=numel, offset=offset).view(shape)

    def close(self) -> None:
        """Unmap; the owner also removes the name. Views of the segment must not be used afterwards."""
        self.data = None
        try:
            self._mmap.close()
        except BufferError:  # a live view still exports the buffer; the mapping goes when the process does
            pass
        if self.owner:
            unlink(self.name)


def _reserve(fd: int, size: int, name: str) -> None:
    """Allocate the segment's pages now: ftruncate alone makes a sparse file, and touching a page that a full tmpfs
    cannot back kills the process with SIGBUS. On ENOSPC the half-made file is removed and the error says why."""
    if size == 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise  # EINVAL / EOPNOTSUPP (a file system without fallocate) propagate too: never a silent SIGBUS
        unlink(name)
        raise ShmFullError(size, f"segment {name}") from None


def unlink(name: str) -> None:
    try:
        os.unlink(SHM_DIR / name)
    except FileNotFoundError:
        pass


def sweep(run: str) -> int:
    """Remove every segment of run `run` (after workers died, they cannot remove their own). Returns the count."""
    names = [p.name for p in SHM_DIR.glob(f"{PREFIX}{run}_*")]
    for name in names:
        unlink(name)
    return len(names)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def sweep_dead_runs() -> int:
    """Remove the segments of every run whose driver process is gone (its workers died with it). Returns the count."""
    dead: dict[int, bool] = {}
    removed = 0
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        pid_text = path.name[len(PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if pid not in dead:
            dead[pid] = not _alive(pid)
        if dead[pid]:
            unlink(path.name)
            removed += 1
    return removed
