"""Using a trained model: predictions of perturbation queries and their changes over control
(``prediction``), genetic-interaction scores and the types they imply (``interactions``),
in-silico combinatorial screens (``screen``), screens over replicates (``replicate_screen``)
and how far the models agree on each call (``screen_statistics``), the perturbation figure
and the screen's map (``figures``) and predictions in cell-eval's layout
(``cell_eval_export``).

May import: ``report``, ``evaluation``, ``runtime``, ``model``, ``data``.
"""
