"""MetaWorld's task names in RLinf's suite order, and the one-line task descriptions RLinf gives them as instructions.

The descriptions are the data of RLinf's `rlinf/envs/metaworld/metaworld_config.json` ("TASK_DESCRIPTIONS"), in its
order, which fixes the task ids of the suite 'metaworld_50'; the ML45 train / test splits ('metaworld_45_ind' /
'metaworld_45_ood') come from metaworld's own `env_dict.ML45_V3`, whose order RLinf's JSON repeats.
"""

from __future__ import annotations

TASK_DESCRIPTIONS: dict[str, str] = {
    "assembly-v3": "Pick up a nut and place it onto a peg",
    "basketball-v3": "Dunk the basketball into the basket",
    "bin-picking-v3": "Grasp the puck from one bin and place it into another bin",
    "box-close-v3": "Grasp the cover and close the box with it",
    "button-press-topdown-v3": "Press a button from the top",
    "button-press-topdown-wall-v3": "Bypass a wall and press a button from the top",
    "button-press-v3": "Press a button",
    "button-press-wall-v3": "Bypass a wall and press a button",
    "coffee-button-v3": "Push a button on the coffee machine",
    "coffee-pull-v3": "Pull a mug from a coffee machine",
    "coffee-push-v3": "Push a mug under a coffee machine",
    "dial-turn-v3": "Rotate a dial 180 degrees",
    "disassemble-v3": "Pick a nut out of a peg",
    "door-close-v3": "Close a door with a revolving joint",
    "door-lock-v3": "Lock the door by rotating the lock clockwise",
    "door-open-v3": "Open a door with a revolving joint",
    "door-unlock-v3": "Unlock the door by rotating the lock counter-clockwise",
    "hand-insert-v3": "Insert the gripper into a hole",
    "drawer-close-v3": "Push and close a drawer",
    "drawer-open-v3": "Open a drawer",
    "faucet-open-v3": "Rotate the faucet counter-clockwise",
    "faucet-close-v3": "Rotate the faucet clockwise",
    "hammer-v3": "Hammer a screw on the wall",
    "handle-press-side-v3": "Press a handle down sideways",
    "handle-press-v3": "Press a handle down",
    "handle-pull-side-v3": "Pull a handle up sideways",
    "handle-pull-v3": "Pull a handle up",
    "lever-pull-v3": "Pull a lever down 90 degrees",
    "peg-insert-side-v3": "Insert a peg sideways",
    "pick-place-wall-v3": "Pick a puck, bypass a wall and place the puck",
    "pick-out-of-hole-v3": "Pick up a puck from a hole",
    "reach-v3": "Reach a goal position",
    "push-back-v3": "Push the puck to a goal",
    "push-v3": "Push the puck to a goal",
    "pick-place-v3": "Pick and place a puck to a goal",
    "plate-slide-v3": "Slide a plate into a cabinet",
    "plate-slide-side-v3": "Slide a plate into a cabinet sideways",
    "plate-slide-back-v3": "Get a plate from the cabinet",
    "plate-slide-back-side-v3": "Get a plate from the cabinet sideways",
    "peg-unplug-side-v3": "Unplug a peg sideways",
    "soccer-v3": "Kick a soccer into the goal",
    "stick-push-v3": "Grasp a stick and push a box using the stick",
    "stick-pull-v3": "Grasp a stick and pull a box with the stick",
    "push-wall-v3": "Bypass a wall and push a puck to a goal",
    "reach-wall-v3": "Bypass a wall and reach a goal",
    "shelf-place-v3": "Pick and place a puck onto a shelf",
    "sweep-into-v3": "Sweep a puck into a hole",
    "sweep-v3": "Sweep a puck off the table",
    "window-open-v3": "Push and open a window",
    "window-close-v3": "Push and close a window",
}

MT10 = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")
"""MetaWorld's MT10 benchmark, in its order (metaworld.env_dict.MT10_V3): the one-hot index of each task."""

SUITES = ("metaworld_50", "metaworld_45_ind", "metaworld_45_ood", "MT10")
"""RLinf's task_suite_name values, and MetaWorld's own MT10."""


def suite_task_names(task_suite_name: str) -> list[str] | None:
    """The task names of a suite or of one task ('push-v3' -> ['push-v3']); None for a name that is neither."""
    if task_suite_name == "metaworld_50":
        return list(TASK_DESCRIPTIONS)
    if task_suite_name == "MT10":
        return list(MT10)
    if task_suite_name in ("metaworld_45_ind", "metaworld_45_ood"):
        from metaworld.env_dict import ML45_V3

        return list(ML45_V3["train" if task_suite_name == "metaworld_45_ind" else "test"])
    if task_suite_name in TASK_DESCRIPTIONS:
        return [task_suite_name]
    return None
