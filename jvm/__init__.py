"""The project's JVM side, with no Spark in it: the Maven artifacts it needs, declared once in
``pom.xml`` and fetched into ``build/jars/`` (``artifacts``), and a single-node Kafka broker for
local runs and tests, started from those jars (``kafka_local``, the ``kafka-local`` command).

Jobs, tests and benchmarks import it to give every Spark session its jars; it imports nothing
of the project but ``commandline`` (one-line errors and exit codes).
"""
