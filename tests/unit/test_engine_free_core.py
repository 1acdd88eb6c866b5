"""The attribution core loads no engine: importing ``attribution`` and every module of it outside
``attribution.spark`` (found on disk, so a new module is covered without a list) loads no
pyspark, pandas or pyarrow. ``lint-imports`` checks the same statically; this checks what Python
actually loads, in a fresh interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from support import ROOT

_PROBE = """
import json, pkgutil, sys
import attribution
def modules(path, prefix):
    # walk_packages would import attribution.spark's subpackages to look inside them
    for m in pkgutil.iter_modules(path, prefix):
        if m.name == "attribution.spark":
            continue
        yield m.name
        if m.ispkg:
            yield from modules([m.module_finder.path + "/" + m.name.rsplit(".", 1)[-1]],
                               m.name + ".")
core = sorted(modules(attribution.__path__, "attribution."))
for name in core:
    __import__(name)
engines = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "pandas", "pyarrow"))
print(json.dumps({"core": core, "engines": engines}))
"""


def test_importing_the_core_loads_no_spark_pandas_or_arrow():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    probe = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env,
                           capture_output=True, text=True, check=True)
    loaded = json.loads(probe.stdout)
    assert {"attribution.core", "attribution.state_codec", "attribution.rows",
            "attribution.models"} <= set(loaded["core"])
    assert loaded["engines"] == []
