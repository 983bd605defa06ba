"""Training on many processes, one module per job:

- ``group_runs``: several runs over a machine's device groups, each started through
  ``launching.choose.launch``;
- ``replicates``: several seeds of a run trained at once over the devices;
- ``pair_screen_workers``: an in-silico pair screen's pairs shared among spawned workers.

A run's options are ``gears_ddp.configuration``'s, starting its ranks
``gears_ddp.launching``'s; ``train_multi_gpu`` itself is in ``gears_ddp.train_distributed``,
the seed guide's module.

May import: ``launching`` and every layer below it.
"""
