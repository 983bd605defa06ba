"""Genetic-interaction scoring of two-gene combinations, observed and predicted: the scores
of many pairs at once, as the published ``GI_predict`` scores one (``scores``), the
interaction types they imply and the genes they are taken on (``calls``), the tables every
set of scored pairs is written as (``pair_tables``), the observed combinations scored from
their observed changes and the same pairs from predicted ones (``observed``), and how far
the two agree, for one model or several (``agreement``).

Scores of changes, whoever predicted them: nothing here runs a model. ``inference`` predicts
the changes (``GEARS.GI_predict``, ``interaction_agreement``, the pair screen) and hands
them in.

May import: ``report``, ``evaluation``, ``runtime``, ``model``, ``data``.
"""
