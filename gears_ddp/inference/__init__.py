"""Using a trained model: predictions of perturbation queries and their changes over control
(``prediction``), genetic-interaction scores and the types they imply (``interactions``),
in-silico combinatorial screens (``screen``), the perturbation figure and the screen's map
(``figures``) and predictions in cell-eval's layout (``cell_eval_export``).

May import: ``evaluation``, ``runtime``, ``model``, ``data``.
"""
