"""The process a run lives in and its peers: what crosses ranks (``ranks``), CPU threads
(``threads``), the host allocator (``host_memory``) and stop signals (``stopping``).

May import: nothing of gears_ddp but ``_logging``. Evaluation and training reach other
processes only through ``ranks``.
"""
