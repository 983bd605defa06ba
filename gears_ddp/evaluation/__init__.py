"""Scoring predictions against the truth: the published metrics accumulated per condition
(``metrics``), the cells' spread at DE genes (``truth_spread``), the no-change, mean-effect,
additive and linear baselines (``baselines``; the linear model of Ahlmann-Eltze et al. in
``linear_baseline``), the summary of a pass over a set (``scoring``), and the statistics
a synthetic preset is calibrated on, measured on a split screen (``calibration``).

May import: ``runtime``, ``data``.
"""
