"""Scoring predictions against the truth: the published metrics accumulated per condition
(``metrics``), the cells' spread at DE genes (``truth_spread``), the no-change, mean-effect
and additive baselines (``baselines``) and the summary of a pass over a set (``scoring``).

May import: ``runtime``, ``data``.
"""
