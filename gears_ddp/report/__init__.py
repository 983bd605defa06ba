"""The run report: verdicts against the baselines, whether the model learned, the summary
of replicates, the run folder's files, plots and the page.

May import: ``evaluation``, ``runtime``, ``data``.
"""
