# Two commands on a fresh machine: `make run` and `make test` (`make test-fast`: the unit tier).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The JVM jars of jvm/pom.xml (Kafka connector, Delta, the local Kafka broker), fetched once with
# mvn into build/jars/ (git-ignored); a Spark session finds them there by itself.
JARS   := build/jars/.fetched

.PHONY: run run-kafka report docs-examples test test-fast lint check-java venv jars clean bench \
        bench-sustainable

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

# Every tier: lint and the import contracts first (seconds), then unit, Spark and system tests on
# TEST_WORKERS pytest-xdist workers, one per core: more workers than cores starve Spark's Python
# workers, which must connect back to their JVM within 10 s. The longest tests start first
# (tests/conftest.py) and an idle worker takes queued tests from a busy one (worksteal).
# Every driver JVM the suite starts (its sessions, the jobs it runs as subprocesses) compiles with
# the JIT's first tier only: on test-sized data the JVMs spend more CPU compiling than running,
# and a cold job ran about 9% faster so (README).
# Every test's outcome and duration also go to TEST_RESULTS (JUnit XML), for CI and for finding
# where the suite's time goes beyond the 20 slowest it prints.
# Every driver JVM also maps CLASS_ARCHIVE, the classes of Spark's jars as a driver loaded them,
# parsed and verified once per clone by tests/class_archive.py (about 45 s): the suite starts
# many JVMs, and a start so costs about a third less CPU. A JVM ignores an archive that does not
# match it (-Xlog:cds=off keeps that quiet) and loads from the jars.
# Every driver JVM evaluates Spark's expressions interpreted (TEST_SPARK_PROPS, Spark settings as
# JVM properties, which any --conf overrides): on test-sized data, generating and compiling Java
# for each query's operators costs more than it saves (README). The spark-submit runs of both
# jobs keep Spark's code generation (tests/support.py: SPARK_CODEGEN_DEFAULTS), as users run it.
# The cluster test's master, workers and executors take the drivers' JVM options, less the Spark
# settings (tests/system/test_cluster.py); the Kafka brokers the suite starts take the JIT's first
# tier (KAFKA_OPTS, which jvm/kafka_local.py passes to the broker's JVM).
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
CLASS_ARCHIVE := $(abspath build/jvm/driver-classes.jsa)
TEST_JIT_OPTS := -XX:TieredStopAtLevel=1
TEST_SPARK_PROPS := -Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN
CDS_LOG_OFF := -Xlog:cds=off -Xlog:cds+dynamic=off
TEST_JVM_OPTS ?= $(TEST_JIT_OPTS) $(TEST_SPARK_PROPS) -XX:SharedArchiveFile=$(CLASS_ARCHIVE) \
	$(CDS_LOG_OFF)
TEST_RESULTS ?= build/test-results.xml

$(CLASS_ARCHIVE): $(STAMP) $(JARS) tests/class_archive.py
	@mkdir -p $(dir $@)
	@echo "building the test JVMs' class archive (tests/class_archive.py) ..."
	@SPARK_SUBMIT_OPTS="$(TEST_JIT_OPTS) $(TEST_SPARK_PROPS) $(CDS_LOG_OFF)" \
		PYSPARK_PYTHON=$(abspath $(PY)) \
		$(PY) tests/class_archive.py $@ > build/jvm/class-archive.log 2>&1 \
		|| { tail -20 build/jvm/class-archive.log; exit 1; }

test: check-java lint $(JARS) $(CLASS_ARCHIVE)
	SPARK_SUBMIT_OPTS="$(strip $(SPARK_SUBMIT_OPTS) $(TEST_JVM_OPTS))" \
	KAFKA_OPTS="$(strip $(KAFKA_OPTS) $(TEST_JIT_OPTS))" \
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest tests -n $(TEST_WORKERS) --dist worksteal \
		--junitxml=$(TEST_RESULTS)

# The unit tier alone: no Spark session, about a minute.
test-fast: lint
	$(PY) -m pytest tests/unit

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
