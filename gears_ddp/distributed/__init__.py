"""Training on many processes: ``train_multi_gpu`` spawning one worker per device
(``spawn``), ``train_replicates`` training several seeds of a run at once (``replicates``),
one rank (``worker``), the torchrun / Slurm entry (``launch``), process groups
and launch variables (``runtime``), the options of a run (``config``) and its YAML file
(``run_config``), and what workers tell the parent (``messages``); screens whose pairs are
shared among spawned workers (``screen``).

May import: ``gears`` (the API) and every layer below it.
"""
