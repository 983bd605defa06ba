"""A run's configuration, declared and checked once: ``sections`` (the sections of a run
file, ``split_config``, ``args`` with its ``model_config``, ``replicates``) and
``run_options`` (``RunOptions``: a whole run's options checked together, read from and
written to its YAML file, ``config.yaml`` in a run folder).

Launching starts a run from these options, and ``distributed`` (replicates), ``sweeps`` and
the command line build them.

May import: the layers below ``gears`` (training, inference and what they import).
"""
