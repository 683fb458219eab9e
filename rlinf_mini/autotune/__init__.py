"""Placement autotune: the best `cluster.component_placement` and `rollout.pipeline_stage_num` for this machine.

    python -m rlinf_mini.autotune --config configs/embodied_mlp.yaml      # table, overlay, key=value's

profile.py measures each component with short real runs (or reads RLinf's `profile_data`), model.py turns the costs
into a predicted step time (the formula and its assumptions are in its docstring), search.py builds RLinf's layouts,
refuses those its rules or the run's own checks reject, and ranks the rest; __main__.py prints and writes.
reasoning.py is the reasoning half (rollout -> reward -> actor: generation, reward and update measured, its own
formula and layouts; the search's ranking and the printing are shared).

RLinf counterpart: `toolkits/auto_placement/` (auto_placement_worker.py's cut search, node.py's costs, fitter.py).
"""
