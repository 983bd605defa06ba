"""The process a run lives in and its peers: what crosses ranks (``ranks``; a step's
gradients through ``gradient_average``), CPU threads (``threads``), the host allocator
(``host_memory``), stop signals (``stopping``), the devices there are (``devices``), what
code asks of a device (``dispatch_count``: operators and host synchronisations) and where a
run's time went (``phase_clock``); how the processes it runs from start to end finish
(``process_end``).

May import: nothing of gears_ddp but ``_logging``. Evaluation and training reach other
processes only through ``ranks``.
"""
