"""The run report: verdicts against the baselines (and the comparisons that are none),
whether the model learned, the summary of replicates, the run folder's files, plots and the
two pages (a run's and the replicates'), built by one page builder.

May import: ``evaluation``, ``runtime``, ``data``.
"""
