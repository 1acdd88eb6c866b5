"""Synthetic out-of-order event generators for the attribution pipeline.

``dataset.generate(GeneratorParams(...), out)`` writes a reproducible, disordered dataset with
its truth (``truth``), manifest (``manifest``) and pictures (``skew``), on two processes when it
is large (``workers``); ``stream`` is the endless variant behind load mode
(``python -m generators stream``, ``load``) and the Spark source (``spark_source``). Parameters
and their defaults live in ``params.GeneratorParams``.
"""
