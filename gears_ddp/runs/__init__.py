"""Saved runs read back: a run folder's model with its data and split, and the run folders a
replicates folder stands for (``saved_runs``); the observed combinations' interaction calls
beside those of saved runs (``interaction_check``); a pair screen over saved replicates
(``pair_screens``).

A run folder is what a run of ``distributed`` leaves (its ``config.yaml`` is
``configuration.run_options``'s, its replicates ``distributed.replicates``'), so reading one
back sits above it.

May import: ``distributed``, ``gears`` and every layer below them.
"""
