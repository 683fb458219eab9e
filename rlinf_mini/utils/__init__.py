"""Small helpers that several layers use, each in a module named for what it does (no grab-bag):

    seeding.py          counter_uniform / counter_normal: noise as a pure function of (seed, env id, step)
    tensor_tree.py      tree_map / tree_cat / tree_stack over a tensor or a dict of tensors
    metric_logger.py    MetricLogger: metrics.jsonl, TensorBoard and the console line (RLinf: utils/metric_logger.py)
    learning_curve.py   plot_learning_curve: eval success and return against the step, as a PNG
"""
