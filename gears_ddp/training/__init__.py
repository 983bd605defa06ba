"""Training: the options (``training_options``), the published optimiser and schedule
(``optimization``), one step and one evaluation pass (``engine``), the one recipe every
process runs (``recipe``), training checkpoints (``checkpoint``) and Weights & Biases
(``tracking``).

May import: ``report``, ``evaluation``, ``runtime``, ``model``, ``data``.
"""
