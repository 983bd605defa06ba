"""What the benchmark scripts share, one job a module, so that no script imports another's
helpers and no measurement is written twice:

- ``settings``: the published hyperparameters and the split every training benchmark uses;
- ``synthetic``: the synthetic data's size options, and the data written, loaded or
  prepared from them (raw h5ad and GO files for both packages, the work folder beside them);
- ``models``: a new or trained GEARS on that data, seeded as every benchmark seeds it;
- ``side_by_side``: the same workflow run with gears_ddp or the published GEARS;
- ``published``: what the published GEARS needs to run here, and its figures read as
  gears_ddp reports them;
- ``child``: a function of a benchmark script run in a child process, its figures back;
- ``torchrun``: a torchrun job's command line and an environment free of launcher variables;
- ``memory``: peak and current resident memory, and a thread that samples peaks;
- ``timing``: device synchronisation, wall and CPU seconds, medians of repeats;
- ``tables``: markdown tables and numbers as the scripts print them;
- ``spread``: mean +- sd over seeds and the paired difference of two sides;
- ``machine``: the machine in words and its load;
- ``record``: ``--record``, appending what a script prints to ``benchmarks/RESULTS.md``, and
  ``--json``, its figures in a file.

The scripts run as ``python benchmarks/bench_x.py``, so ``benchmarks/`` is on ``sys.path``
and they import ``harness.<module>``.
"""
