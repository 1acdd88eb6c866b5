"""Helpers shared by test modules of every tier (tests import these, never each other), by what
they are for:

* ``support.datasets``: the inputs: the chapter 7 dataset and its rows, hand-built sessions,
  generated multi-touch and late datasets, records with conflicting copies, hypothesis
  strategies for copies and noise, and files staged in a given arrival order;
* ``support.reference``: what the outputs are compared with: an independent brute-force reading
  of the rules on networkx, Spark's late-record rule, a changelog's fold and revisions, and
  row equality within rounding;
* ``support.outputs``: the job's outputs read through Spark's commit protocol, and attribution
  output written without Spark as Spark's sinks lay it out;
* ``support.commands``: running a command as a user would (its environment, JVM options and
  jars, file permissions, a signal after a micro-batch) and reading its stderr.

``ROOT`` here is the repository.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
