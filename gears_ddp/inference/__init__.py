"""Using a trained model: predictions of perturbation queries and their changes over control
(``prediction``; the genetic-interaction scores are ``gears_ddp.interactions``'),
in-silico pair screens (``pair_screen_job``, their options ``pair_screen_options``), pair screens
over replicates (``replicate_pair_screen``) and how far the models agree on each call
(``pair_screen_statistics``), the perturbation figure and the pair screen's map
(``figures``), predictions in cell-eval's layout (``cell_eval_export``), and the published
``gears.inference`` functions under their names (``published_inference``: ``from
gears_ddp.inference import evaluate, compute_metrics, deeper_analysis,
non_dropout_analysis``).

May import: ``interactions``, ``report``, ``evaluation``, ``runtime``, ``model``, ``data``.
"""

from gears_ddp.inference.published_inference import compute_metrics, deeper_analysis, evaluate, non_dropout_analysis

__all__ = ["compute_metrics", "deeper_analysis", "evaluate", "non_dropout_analysis"]

# names the paper's scripts import from gears.inference that no published release defines
UNPUBLISHED_NAMES = {
    "GIs": "the Norman et al. 2019 interaction labels of an unreleased GEARS (cell-gears 0.1.2 does not define "
    "GIs either: its GI_subgroup fails for want of it). To call the interactions of the observed "
    "combinations of your own data, use GEARS.observed_interactions() or gears-ddp interactions "
    "(docs/observed-interactions.md)",
}


def __getattr__(name: str):
    """An ImportError that says what to use instead, for a name of an unreleased GEARS."""
    if name in UNPUBLISHED_NAMES:
        raise ImportError(f"gears_ddp.inference has no {name}: {UNPUBLISHED_NAMES[name]}")
    raise AttributeError(f"module 'gears_ddp.inference' has no attribute {name!r}")
