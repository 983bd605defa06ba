"""Launching a run's ranks, one module per job (Lightning's design: cluster environments, one
launcher protocol, one place that chooses):

- ``environments``: where the ranks come from (local processes, torchrun, Slurm), each
  environment detected from the launchers' variables and owning a rank's place, its
  rendezvous address and port, and its scheduler's restart and requeue; the only module that
  reads those variables;
- ``launchers``: the ``Launcher`` protocol, the opening every run shares, and the three
  launchers (ranks spawned here, this process as one rank, a group's ranks left running);
- ``choose``: ``launch``, which picks the environment and the launcher;
- ``supervisor``: spawned workers watched, their logs handed on, a failure named by rank;
- ``worker_messages``: the typed messages workers send their parent, on a channel that
  cannot hang;
- ``process_group``: joining and leaving the ``torch.distributed`` process group;
- ``main_guard``: refusing to spawn from a script without ``if __name__ == "__main__":``;
- ``rank_training``: what one rank runs (join the group, check the data, train).

``train_multi_gpu`` itself is in ``gears_ddp.train_distributed``, the seed guide's module.

May import: ``gears`` (the API) and every layer below it, the run's options
(``configuration``) among them.
"""
