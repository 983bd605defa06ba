"""Using a trained model: predictions of perturbation queries (``prediction``),
genetic-interaction scores (``interactions``), the perturbation figure (``figures``) and
predictions in cell-eval's layout (``cell_eval_export``).

May import: ``evaluation``, ``runtime``, ``model``, ``data``.
"""
