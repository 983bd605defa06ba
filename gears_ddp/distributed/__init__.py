"""Training on many processes, one module per job:

- ``config`` and ``run_config``: the options of a run, checked once (``RunOptions``), and
  its YAML file;
- ``launcher``: the opening every run shares, then one way of starting its ranks;
- ``before_spawn``: the data a spawned run prepares before any process starts;
- ``supervisor``: spawned workers watched, their logs handed on, a failure named by rank;
- ``main_guard``: refusing to spawn from a script without ``if __name__ == "__main__":``;
- ``messages``: the typed messages workers send their parent, on a channel that cannot hang;
- ``rank``: one rank of a run (join the group, check the data, train);
- ``process_group``: joining and leaving the ``torch.distributed`` process group;
- ``launch_environment`` and ``launch``: ranks started by torchrun or Slurm;
- ``replicates``: several seeds of a run trained at once over the devices;
- ``pair_screen``: an in-silico pair screen's pairs shared among spawned workers.

``train_multi_gpu`` itself is in ``gears_ddp.train_distributed``, the seed guide's module.

May import: ``gears`` (the API) and every layer below it.
"""
