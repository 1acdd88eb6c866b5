"""Synthetic out-of-order event generators for the attribution pipeline.

``dataset.generate(GeneratorParams(...), out)`` writes a reproducible, disordered dataset with
its truth and manifest; ``stream`` is the endless variant behind load mode
(``python -m generators stream``) and the Spark source (``spark_source``). Parameters and their
defaults live in ``params.GeneratorParams``.
"""
