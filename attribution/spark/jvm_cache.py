"""Values built from a JVM once per JVM: py4j objects (Columns, class handles) stay valid for as
long as their gateway, and building them costs py4j round trips that a hot path need not pay
again (the validation rules are hundreds of such calls per query built, and the driver's reads
of Hadoop file systems look up their classes on every call)."""
from __future__ import annotations

import functools
from typing import Callable


def once_per_jvm(build: Callable) -> Callable:
    """``build`` (a function of hashable arguments that returns py4j objects) run once per JVM
    and arguments; a new JVM (a new py4j gateway) builds them again.

    :param build: the function to cache.
    """
    built: dict = {}

    @functools.wraps(build)
    def cached(*args):
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        if args not in built or built[args][0] is not gateway:
            built[args] = (gateway, build(*args))
        return built[args][1]

    return cached
