"""The run report: verdicts against the baselines, the run folder's files, plots and page."""
