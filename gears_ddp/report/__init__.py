"""The run report: verdicts against the baselines, the run folder's files, plots and the
page.

May import: ``evaluation``, ``runtime``, ``data``.
"""
