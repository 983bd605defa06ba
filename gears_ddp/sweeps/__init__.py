"""Hyperparameter sweeps of gears_ddp runs: ``space`` (what a trial draws), ``study`` (where
Optuna's study lives), ``train_sweep`` (trials placed over the devices, pruned on validation,
resumable: ``train_sweep``) and ``report`` (trials.csv, the best run's run.yaml, report.html).
"""
