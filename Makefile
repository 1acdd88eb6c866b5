# Two commands on a fresh machine: `make run` and `make test` (`make test-slow`: the second tier;
# `make test-fast`: the unit tier).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The JVM jars of jvm/pom.xml (Kafka connector, Delta, the local Kafka broker), fetched once with
# mvn into build/jars/ (git-ignored); a Spark session finds them there by itself.
JARS   := build/jars/.fetched

.PHONY: run run-kafka report docs-examples test test-slow test-fast durations lint check-java venv \
        jars clean bench bench-sustainable

check-java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17+ is required (no 'java' on PATH); install a JDK 17, e.g. 'apt-get install openjdk-17-jre-headless'"; exit 1; }
	@java -version 2>&1 | awk -F'"' '/version/ { split($$2, v, "."); if (v[1] < 17) { print "error: Java 17+ is required, found " $$2; exit 1 } }'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,plot]'
	@touch $(STAMP)

venv: $(STAMP)

$(JARS): jvm/pom.xml $(STAMP)
	$(PY) -m jvm.artifacts
	@touch $(JARS)

jars: $(JARS)

run: check-java $(STAMP) $(JARS)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m jobs.example

# The report of `make run`'s output (out/example/attributions) into out/example/report.
EXAMPLE_OUT := out/example
report: $(STAMP)
	@test -d $(EXAMPLE_OUT)/attributions || { echo "error: no $(EXAMPLE_OUT)/attributions to report on: run 'make run' first"; exit 2; }
	$(PY) -m jobs.report --attributions $(EXAMPLE_OUT)/attributions --out $(EXAMPLE_OUT)/report

# The same example through Kafka topics, on a local broker the example starts and stops.
run-kafka: check-java $(STAMP) $(JARS)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m jobs.example_kafka

# The example outputs the docs quote, redrawn from a run of `make run`'s example on the current
# code (jobs/docs_examples.py; tests/unit/test_docs_examples.py holds the docs to its figures).
docs-examples: check-java $(STAMP) $(JARS)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m jobs.docs_examples

# `make test`: lint and the import contracts first (seconds), then unit, Spark and system tests on
# TEST_WORKERS pytest-xdist workers, one per core: more workers than cores starve Spark's Python
# workers, which must connect back to their JVM within 10 s. The longest tests start first
# (tests/conftest.py, by tests/durations.json) and an idle worker takes queued tests from a busy
# one (worksteal). PYTEST_ARGS adds pytest options (e.g. -k NAME, or -x).
# The test JVMs' settings, kept where an A/B shows they are worth at least 5 % of the suite's CPU
# (commit 0253b8c; each arm three times in turn, the CPU of its whole process tree from a
# cgroup, on two streaming-layouts runs and tests/system/test_operator_errors.py: medians below):
# - TEST_JIT_OPTS: every JVM the suite starts (its sessions, the jobs it runs as subprocesses,
#   the cluster's daemons and executors) and the Kafka brokers (KAFKA_OPTS, which
#   jvm/kafka_local.py passes to the broker's JVM) compile with the JIT's first tier only: on
#   test-sized data the JVMs spend more CPU compiling than running. 68.3 CPU s (51.6 s wall)
#   with it against 98.6 (60.0 s) without: 31 % of the CPU.
# - TEST_SPARK_PROPS: every driver JVM of the suite's sessions and in-process jobs evaluates
#   Spark's expressions interpreted (Spark settings as JVM properties, which any --conf
#   overrides): generating and compiling Java for each query's operators costs more than it saves
#   on test data, most in the tests of many short queries. On the A/B above (few, long queries)
#   it saved 2 % (69.8 CPU s with code generation). Over make test it is worth more: fresh
#   clones' make test of 75b122a (code generation) and 6ed8bd4 (interpreted; otherwise the same
#   tests and settings), one after the other: tests/spark summed 1838 s against 1228, while
#   tests/unit (no JVM) took 118 s against 102, so beyond the machine's drift code generation
#   cost about 29 % of the Spark tier, about 16 % of make test. The runs that stand for a user
#   (the crash runs, the cluster, spark-submit) keep Spark's code generation
#   (SPARK_CODEGEN_DEFAULTS of tests/support/commands.py, or their own JVM's defaults).
# Left out, as not worth 5 %:
# - A class archive of Spark's classes (-XX:SharedArchiveFile) saved 4.1 CPU s and 3.4 s wall per
#   JVM start (a session's start and first query: medians of four each, 6.0 against 10.2 CPU s),
#   but building it cost about 45 s of every fresh clone's make test, against about 35 JVM starts
#   in make test; on the A/B above the pairs' ratios were 1.14, 0.98 and 0.83.
# The cluster test's master, workers and executors take the drivers' JVM options, less the Spark
# settings (tests/system/test_cluster.py): 140 CPU s against 289 and 276 (commit 3d9546d).
# Every test's outcome and duration also go to TEST_RESULTS (JUnit XML), for CI and for finding
# where the suite's time goes.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
TEST_JIT_OPTS := -XX:TieredStopAtLevel=1
TEST_SPARK_PROPS := -Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN
TEST_JVM_OPTS ?= $(TEST_JIT_OPTS) $(TEST_SPARK_PROPS)
TEST_RESULTS ?= build/test-results.xml
TEST_RESULTS_SLOW ?= build/test-results-slow.xml

# pytest on the suite's workers with the test JVMs' options; $(1): the marker expression of the
# tier, $(2): its JUnit file. `tests/timings.py` reads the JUnit files: `per-file` prints the
# summed seconds of each file, `record` keeps each test's seconds in tests/durations.json, which
# orders the next run longest first (`make durations` after both tiers).
define run_tier
	SPARK_SUBMIT_OPTS="$(strip $(SPARK_SUBMIT_OPTS) $(TEST_JVM_OPTS))" \
	KAFKA_OPTS="$(strip $(KAFKA_OPTS) $(TEST_JIT_OPTS))" \
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest tests -m "$(1)" -n $(TEST_WORKERS) \
		--dist worksteal --junitxml=$(2) $(PYTEST_ARGS)
	@$(PY) tests/timings.py per-file $(2)
endef

# Every proof of docs/guarantees.md: the tests not marked `slow`.
test: check-java lint $(JARS)
	$(call run_tier,not slow,$(TEST_RESULTS))

# The second tier, which CI runs after `make test`: the configurations and benchmark modes that
# `make test` leaves out (the tests marked `slow`).
test-slow: check-java $(STAMP) $(JARS)
	$(call run_tier,slow,$(TEST_RESULTS_SLOW))

durations: $(STAMP)
	$(PY) tests/timings.py record $(wildcard $(TEST_RESULTS) $(TEST_RESULTS_SLOW))

# The unit tier alone: no Spark session, about a minute.
test-fast: lint
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

bench: check-java $(STAMP) $(JARS)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m benchmarks.streaming

# The highest input rate each query sustains, fed live (benchmarks/streaming/sustainable.py).
bench-sustainable: check-java $(STAMP) $(JARS)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m benchmarks.streaming --only-modes --sustainable

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
