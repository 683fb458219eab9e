"""Devices, collectives, weight sync and /dev/shm for a GPU machine.

Two kinds of tests:
- CPU tests with a faked GPU count (always run): which GPU each rank of each shipped config gets on 1, 2 and 8 GPUs,
  which collective the actor uses, which weight-sync path each rollout rank gets (the table: run with -s to see it),
  checked against the environment `Cluster.rank_spec` really gives a rank; `CUDA_VISIBLE_DEVICES` entries and UUIDs;
  a full /dev/shm as one line before training starts (and a real 128 KB tmpfs where this runs as root).
- `gpu` tests: the CUDA paths themselves (CUDA IPC and pinned weight sync, a channel carrying CUDA tensors, gloo over
  CUDA tensors for two ranks on one GPU). They run with `RLINF_MINI_TEST_GPU=1 pytest tests/test_gpu.py` on a
  machine with a GPU, and are skipped with the reason elsewhere.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlinf_mini.config import ClusterConfig, config_from_yaml, load_config
from rlinf_mini.scheduler import devices, shm
from stages.placement import HybridComponentPlacement

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml")  # the embodied ones (env, rollout, actor), as
                 if config_from_yaml(p).runner.task_type != "reasoning")  # loaded (a defaults list names the task)
COMPONENTS = ("env", "rollout", "actor")

GPU_REASON = ("needs RLINF_MINI_TEST_GPU=1 and a CUDA GPU" if os.environ.get("RLINF_MINI_TEST_GPU") != "1"
              else "RLINF_MINI_TEST_GPU=1 but torch sees no CUDA GPU")
_no_gpu = pytest.mark.skipif(os.environ.get("RLINF_MINI_TEST_GPU") != "1" or not torch.cuda.is_available(),
                             reason=GPU_REASON)


def gpu(test):
    """Mark a test `gpu` (select with -m gpu) and skip it, with the reason, where no GPU is asked for or present."""
    return pytest.mark.gpu(_no_gpu(test))


# --------------------------------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES as the user gave it


def test_visible_gpus_are_the_parents_entries_indices_or_uuids():
    assert devices.visible_gpus({}, 3) == ["0", "1", "2"]  # unset: every GPU, by index
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5"}, 2) == ["4", "5"]
    uuids = "GPU-8e1a2b3c-0000-1111-2222-333344445555,GPU-9f00aa11-0000-1111-2222-333344445555"
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": uuids}, 2) == uuids.split(",")
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 0) == []
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": "4,bogus,5"}, 1) == ["4"]  # CUDA stops at a bad entry


def test_rank_device_env_maps_devices_through_the_visible_list():
    visible = ["4", "5"]
    assert devices.rank_device_env((0,), 2, visible) == {"CUDA_VISIBLE_DEVICES": "4"}
    assert devices.rank_device_env((1,), 2, visible) == {"CUDA_VISIBLE_DEVICES": "5"}
    assert devices.rank_device_env((0, 1), 2, visible) == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert devices.rank_device_env((3,), 4, visible) == {"CUDA_VISIBLE_DEVICES": "5"}  # 3 mod 2 GPUs
    assert devices.rank_device_env((0, 2), 4, visible) == {"CUDA_VISIBLE_DEVICES": "4"}  # both map to GPU 4: once
    assert devices.rank_device_env((1,), 2, []) == {"CUDA_VISIBLE_DEVICES": ""}  # no GPU: CPU
    with pytest.raises(ValueError, match="cluster.num_devices=2"):
        devices.rank_device_env((2,), 2, visible)


def test_num_devices_minus_one_means_every_visible_gpu():
    assert devices.resolve_num_devices(-1, 8) == 8
    assert devices.resolve_num_devices(-1, 0) == devices.CPU_DEFAULT_DEVICES
    assert devices.resolve_num_devices(3, 8) == 3
    assert load_config([]).cluster.num_devices == -1  # the default


def cluster_env(monkeypatch, num_gpus: int, visible_env: str | None, num_devices: int,
                placement: HybridComponentPlacement) -> dict[str, str]:
    """The CUDA_VISIBLE_DEVICES that `Cluster.rank_spec` gives each rank ("actor:1" -> entries: what the backend sets
    before the rank imports torch), with `num_gpus` faked (nothing is started)."""
    from rlinf_mini.scheduler.cluster import Cluster

    monkeypatch.setattr(torch.cuda, "device_count", lambda: num_gpus)
    if visible_env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible_env)
    seen: dict[str, str] = {}
    cluster = Cluster(ClusterConfig(num_devices=num_devices, timeout_s=5))
    try:
        for comp in COMPONENTS:
            strategy = placement.get_strategy(comp)
            group = SimpleNamespace(name=comp, world_size=strategy.world_size, cls=object, cfg=None, args=())
            for p in strategy.placements:
                seen[f"{comp}:{p.rank}"] = cluster.rank_spec(group, p).env["CUDA_VISIBLE_DEVICES"]
    finally:
        cluster.shutdown()
    return seen


def test_cluster_gives_ranks_the_parents_entries(monkeypatch):
    placement = HybridComponentPlacement({"env": "0", "rollout": "1", "actor": "0-1"}, 2)
    seen = cluster_env(monkeypatch, 2, "GPU-aaaa,GPU-bbbb", 2, placement)
    assert seen == {"env:0": "GPU-aaaa", "rollout:0": "GPU-bbbb", "actor:0": "GPU-aaaa", "actor:1": "GPU-bbbb"}
    seen = cluster_env(monkeypatch, 2, "4,5", 2, placement)
    assert seen["actor:1"] == "5" and seen["env:0"] == "4"  # physical GPUs 4 and 5, not 0 and 1
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5"  # the driver's own value is untouched


# --------------------------------------------------------------------------------------------------------------------
# Collective and sync path


def test_collective_backend_needs_one_gpu_per_rank_for_nccl():
    assert devices.collective_backend([("0",), ("1",)])[0] == "nccl"
    backend, why = devices.collective_backend([("0",), ("0",)], grad_bytes=4_000_000)
    assert backend == "gloo" and "share GPU 0" in why and "4.0 MB" in why
    assert devices.collective_backend([("0", "1"), ("1", "2")])[0] == "gloo"  # overlapping multi-GPU ranks
    assert devices.collective_backend([(), ()]) == ("gloo", "CPU tensors")
    assert devices.collective_backend([("0",)])[0] == "none"


def test_sync_path_by_gpu():
    assert devices.sync_path(("3",), ("3",)) == "cuda ipc"
    assert devices.sync_path(("3",), ("4",)) == "pinned host copy"
    assert devices.sync_path((), ()) == "shared buffer"


def plan_of(config: str, num_gpus: int) -> tuple[devices.DevicePlan, HybridComponentPlacement, int]:
    cfg = load_config(["--config", str(ROOT / "configs" / config)])
    n = devices.resolve_num_devices(cfg.cluster.num_devices, num_gpus)
    placement = HybridComponentPlacement(cfg.cluster.component_placement, n)
    return devices.device_plan({c: placement.get_strategy(c) for c in COMPONENTS}, n, num_gpus), placement, n


def _ranks(gpus: tuple[tuple[str, ...], ...]) -> str:
    return " ".join("+".join(g) for g in gpus)


def test_shipped_configs_on_1_2_and_8_gpus(monkeypatch, capsys):
    """The table of the issue: each shipped config on 1, 2 and 8 faked GPUs -> the GPU of every rank, the actor's
    collective, the weight-sync path; each rank's GPU is checked against what Cluster.rank_spec sets."""
    rows = []
    for num_gpus in (1, 2, 8):
        for config in CONFIGS:
            plan, placement, n = plan_of(config, num_gpus)
            # what the plan says == what the Cluster really gives each rank
            seen = cluster_env(monkeypatch, num_gpus, None, n, placement)
            for comp in plan.components:
                for rank, gpus in enumerate(comp.gpus):
                    assert seen[f"{comp.component}:{rank}"] == ",".join(gpus), (config, num_gpus, comp, rank)
            actor, rollout = plan.component("actor"), plan.component("rollout")
            # independent checks of the decisions, from the raw device numbers
            actor_gpu = [{d % num_gpus for d in devs} for devs in actor.devices]
            disjoint = sum(len(s) for s in actor_gpu) == len(set().union(*actor_gpu))
            expected = "none" if len(actor_gpu) == 1 else ("nccl" if disjoint else "gloo")
            assert plan.collective[0] == expected, (config, num_gpus, plan.collective)
            for r, devs in enumerate(rollout.devices):
                same = devs[0] % num_gpus == actor.devices[0][0] % num_gpus
                assert plan.sync[r] == ("cuda ipc" if same else "pinned host copy"), (config, num_gpus, r)
            assert (plan.note is not None) == (n < num_gpus)
            rows.append(f"| {num_gpus} | {config} | {n} | {_ranks(plan.component('env').gpus)} | "
                        f"{_ranks(rollout.gpus)} | {_ranks(actor.gpus)} | {plan.collective[0]} | "
                        f"{', '.join(sorted(set(plan.sync)))} |")
    table = ["| GPUs | config | devices | env ranks -> GPU | rollout ranks -> GPU | actor ranks -> GPU | "
             "actor collective | weight sync |", "|---|---|---|---|---|---|---|---|", *rows]
    with capsys.disabled():
        print("\n" + "\n".join(table))
    # On one GPU every two-rank actor must avoid NCCL (the first failure of the issue)
    for config in CONFIGS:
        plan, _, _ = plan_of(config, 1)
        if len(plan.component("actor").gpus) > 1:
            assert plan.collective[0] == "gloo", config


def test_explain_shows_devices_collective_and_its_cost():
    from rlinf_mini.explain import explain

    cfg = load_config(["--config", str(ROOT / "configs/embodied.yaml")])
    text, error = explain(cfg, "configs/embodied.yaml", num_gpus=1)
    assert error is None
    assert "actor collective: gloo (ranks 0 and 1 share GPU 0" in text and "host memory" in text
    assert "weight sync to rollout ranks: cuda ipc" in text
    text, _ = explain(cfg, "configs/embodied.yaml", num_gpus=8)
    assert "actor collective: nccl" in text and "of the 8 visible" in text
    text, _ = explain(cfg, "configs/embodied.yaml", num_gpus=0)
    assert "actor collective: gloo (CPU tensors)" in text and "shared buffer" in text
    bf16 = dataclasses.replace(cfg, actor=dataclasses.replace(
        cfg.actor, model=dataclasses.replace(cfg.actor.model, precision="bf16")))
    assert explain(bf16, "x", num_gpus=1)[1] is None
    assert "actor.model.precision: 'bf16' needs a GPU" in explain(bf16, "x", num_gpus=0)[1]


def test_fewer_devices_than_gpus_is_said_once_at_start(tmp_path, monkeypatch, capsys):
    """An 8-GPU machine, a 2-device config: one note line before the cluster starts (the cluster is stubbed)."""
    from rlinf_mini import train
    from rlinf_mini.scheduler import cluster as cluster_module

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # unset: all 8 are visible

    class Stop(Exception):
        pass

    def no_cluster(self, cfg, preload=(), device_plan=None):
        raise Stop

    monkeypatch.setattr(cluster_module.Cluster, "__init__", no_cluster)
    cfg = load_config(["--config", str(ROOT / "configs/embodied_mlp.yaml"),
                       "--runner.logger.log-path", str(tmp_path)])
    plan = train.RunPlan(cfg, "configs/embodied_mlp.yaml")
    with pytest.raises(Stop):
        train.build_and_run(cfg, plan)
    err = capsys.readouterr().err
    assert err.count("note: cluster.num_devices = 2 uses GPU(s) 0,1 of the 8 visible") == 1, err


def test_bf16_without_a_gpu_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch):
    from rlinf_mini.train import main

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    code = main(["--config", str(ROOT / "configs/embodied_mlp.yaml"), "--rollout.model.precision", "bf16",
                 "--runner.logger.log-path", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "rollout.model.precision: 'bf16' needs a GPU" in err, err
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------------------------------------------------
# /dev/shm


def test_a_full_dev_shm_is_an_error_at_creation_not_a_sigbus(monkeypatch):
    def enospc(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", enospc)
    with pytest.raises(shm.ShmFullError) as info:
        shm.SharedSegment.create(1 << 20, tag="weights")
    text = str(info.value)
    assert text.startswith(f"{shm.SHM_DIR} is too small") and "needs 1.0 MiB" in text and "--shm-size" in text
    assert f"df -h {shm.SHM_DIR}" in text
    assert not list(shm.SHM_DIR.glob(f"{shm.PREFIX}{shm.run_id()}_weights_*"))  # the half-made file is gone
    # a worker's traceback carries it; the driver prints that one line
    assert shm.ShmFullError.find_in(f"Traceback ...\nrlinf_mini.scheduler.shm.ShmFullError: {text}\n") == text


def test_segments_reserve_their_pages():
    seg = shm.SharedSegment.create(256 * 1024, tag="test")
    try:
        blocks = os.stat(shm.SHM_DIR / seg.name).st_blocks * 512
        assert blocks >= 256 * 1024  # allocated now, not sparse (a sparse file would show ~0 blocks)
    finally:
        seg.close()


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=128k tmpfs /dev/shm"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs root and `unshare -m` to mount a 128 KB tmpfs on /dev/shm")
def test_default_run_on_a_128k_dev_shm_stops_in_seconds_with_one_line(tmp_path):
    log_path = tmp_path / "results"
    script = (f"mount -t tmpfs -o size=128k tmpfs /dev/shm && exec {sys.executable} -m rlinf_mini.train "
              f"--config configs/embodied.yaml --runner.logger.log-path {log_path}")
    start = time.monotonic()
    run = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    lines = run.stderr.strip().splitlines()
    print(f"\n128 KB /dev/shm: exit {run.returncode} after {seconds:.1f} s: {run.stderr.strip()}")
    assert run.returncode == 1 and len(lines) == 1, run.stderr
    assert lines[0].startswith("error: /dev/shm is too small for the weight buffers") and "KiB free" in lines[0]
    assert "needs " in lines[0] and "--shm-size" in lines[0] and "df -h /dev/shm" in lines[0]
    assert not log_path.exists()  # refused before the run folder, so before any training (the time is printed)


# --------------------------------------------------------------------------------------------------------------------
# On a GPU


def _spawn(target, *args):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def _stop(*procs) -> None:
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join(5)


@gpu
@pytest.mark.parametrize("path", ["cuda ipc", "pinned host copy"])
def test_gpu_weight_sync_is_bitwise_on_both_paths(path):
    import multiprocessing

    from gpu_helpers import SmallModel, gpu_weight_receiver

    from stages.sync import WeightSender

    ctx = multiprocessing.get_context("spawn")
    handle_q, out_q = ctx.Queue(), ctx.Queue()
    proc = _spawn(gpu_weight_receiver, 3, handle_q, out_q, 60.0)
    sender = WeightSender()
    try:
        handle = handle_q.get(timeout=120)
        if path == "pinned host copy":  # as if the rollout were on another GPU of the node
            handle = dataclasses.replace(handle, gpu="GPU-elsewhere")
        model = SmallModel().cuda()
        weights = dict(model.state_dict(keep_vars=True))
        assert sender._gpu.path(weights, handle) == path
        for v in range(3):
            with torch.no_grad():
                model.weight.normal_()
                model.bias.normal_()
                model.steps.fill_(v + 10)
            sender.send(model, [handle], v)
            got_v, state = out_q.get(timeout=60)
            assert got_v == v
            for k, t in model.state_dict().items():
                assert torch.equal(state[k], t.cpu()), (path, v, k)
    finally:
        sender.close()
        _stop(proc)


@gpu
def test_gpu_channel_sends_cuda_tensors_through_one_host_copy():
    from rlinf_mini.scheduler.channel import close_process_resources, dumps, loads

    try:
        for t in (torch.randn(64, 3, 32, 32, device="cuda"), torch.arange(10, device="cuda"),
                  torch.randn(300, 300, device="cuda").t(), torch.randn(40000, device="cuda").bfloat16()):
            out = loads(dumps(t))
            assert out.device.type == "cpu" and torch.equal(out, t.cpu())
            del out
    finally:
        close_process_resources()


@gpu
def test_gpu_two_ranks_on_one_gpu_all_reduce_with_gloo():
    import multiprocessing

    from gpu_helpers import gpu_collective_rank

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = multiprocessing.get_context("spawn").Queue()
    procs = [_spawn(gpu_collective_rank, r, port, q, 60.0) for r in range(2)]
    try:
        results = sorted(q.get(timeout=120) for _ in range(2))
    finally:
        _stop(*procs)
    for rank, backend, t in results:
        assert backend == "gloo" and torch.equal(t, torch.full((4,), 3.0)), (rank, backend, t)


def test_device_sync_protocol_on_the_cpu(monkeypatch):
    """The GPU receiver and sender's layout, header and both paths, run on CPU tensors (CUDA calls stubbed): every
    tensor arrives bitwise, and the receiver loads from the host buffer only after a host-path version. The CUDA
    specifics (IPC, pinning, synchronize) are the `gpu` tests' part."""
    from gpu_helpers import SmallModel

    from stages import sync, sync_gpu

    monkeypatch.setattr(sync_gpu, "pin", lambda seg: False)
    monkeypatch.setattr(sync_gpu, "gpu_id", lambda device: "GPU-test")
    monkeypatch.setattr(sync_gpu.GpuWeightReceiver, "_share", staticmethod(lambda flat: b"ipc"))
    rollout, actor = SmallModel(), SmallModel()
    receiver = sync_gpu.GpuWeightReceiver(rollout)
    sender = sync.WeightSender()
    try:
        handle = receiver.handle()
        assert handle.gpu == "GPU-test" and handle.cuda_ipc == b"ipc"
        for v, path in enumerate(["pinned host copy", "cuda ipc", "pinned host copy"]):
            monkeypatch.setattr(sync_gpu.GpuSender, "path", lambda self, weights, h, p=path: p)
            if path == "cuda ipc":
                sender._gpu._ipc[handle.segment_name] = receiver.flat  # what opening the IPC handle gives
            with torch.no_grad():
                actor.weight.normal_()
                actor.bias.normal_()
                actor.steps.fill_(v + 5)
            sender.send(actor, [handle], v)
            receiver.wait_for_version(v, timeout=5)
            for k, t in actor.state_dict().items():
                assert torch.equal(rollout.state_dict()[k], t), (path, k)
            # the parameters are views of the flat buffer: the copy landed in the weights the rollout infers with
            assert rollout.weight.data_ptr() == receiver.flat.data_ptr() + handle.layout[0].offset
    finally:
        sender.close()
        receiver.close()


def test_a_timed_out_all_reduce_is_reported_as_a_timeout():
    from rlinf_mini.scheduler.collective import CollectiveTimeout, TorchDistCollective

    def all_reduce(t):  # what ProcessGroupNCCL's blocking wait raises (DistBackendError is a RuntimeError)
        raise RuntimeError("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
                           "OpType=ALLREDUCE) ran for 30000 milliseconds before timing out.")

    coll = TorchDistCollective.__new__(TorchDistCollective)
    coll._dist, coll.backend, coll.timeout_s = SimpleNamespace(all_reduce=all_reduce), "nccl", 30.0
    with pytest.raises(CollectiveTimeout, match=r"nccl all_reduce of \(3,\) did not complete within 30 s"):
        coll.all_reduce(torch.zeros(3))
    coll._dist = SimpleNamespace(all_reduce=lambda t: (_ for _ in ()).throw(RuntimeError("NCCL error: unhandled")))
    with pytest.raises(RuntimeError, match="unhandled"):  # other failures pass through unchanged
        coll.all_reduce(torch.zeros(3))
