"""Benchmarks of the project: the streaming jobs against Spark's native count (``streaming``), the
engine-free core (``core``), the generator (``generator``) and one hot key (``hot_key``).

Run each as a module, e.g. ``python -m benchmarks.streaming --help``.
"""
