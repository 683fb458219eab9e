"""Gymnasium envs that fail on purpose (for tests/test_faults.py). A config names one as
`init_params.id: "toy_envs:BrokenStep-v0"`: gymnasium imports this module (registering the ids) before making it."""

from __future__ import annotations

import gymnasium
import numpy as np


class BrokenEnv(gymnasium.Env):
    """A 2-D Box env whose reset or step raises after `ok_steps` steps (fail_in: 'reset' or 'step')."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, fail_in: str = "step", ok_steps: int = 3):
        self.fail_in, self.ok_steps, self.steps = fail_in, ok_steps, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.fail_in == "reset":
            raise RuntimeError("simulator lost its GPU context (planned)")
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps > self.ok_steps:
            raise RuntimeError("physics exploded (planned)")
        return np.zeros(2, np.float32), 0.0, False, False, {}


gymnasium.register("BrokenStep-v0", entry_point=BrokenEnv, kwargs={"fail_in": "step"})
gymnasium.register("BrokenReset-v0", entry_point=BrokenEnv, kwargs={"fail_in": "reset"})
