"""The runtime (RLinf: `rlinf/scheduler/`): it starts ranks on devices, runs group calls and moves data; it knows
nothing about RL and imports only itself and `rlinf_mini/config/`.

    cluster.py     Cluster: devices (GPUs or CPU shares) and nodes; picks the backend (cluster.backend)
    placement.py   ProcessPlacement, PlacementStrategy, PlacementMode: what stages/placement.py produces
    devices.py     which GPU each rank gets, which collective, which weight-sync path (pure functions)
    worker.py      Worker, WorkerGroup, GroupFuture: a call on every rank, its results or its failure
    channel.py     Channel: keyed, bounded producer-consumer queues between any processes
    shm.py         named shared-memory segments, swept when their run ends
    faults.py      RLINF_MINI_FAULT: inject a crash, a hang or a NaN into one worker
    tracer.py      spans -> trace.json, timeline.png, busy / idle / bubble metrics

Nothing is imported here: a worker process imports `rlinf_mini.scheduler.worker` before torch, and must not pull
torch in through this package.
"""
