# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test check-java venv clean bench

check-java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17+ is required (no 'java' on PATH); install a JDK 17, e.g. 'apt-get install openjdk-17-jre-headless'"; exit 1; }
	@java -version 2>&1 | awk -F'"' '/version/ { split($$2, v, "."); if (v[1] < 17) { print "error: Java 17+ is required, found " $$2; exit 1 } }'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,plot]'
	@touch $(STAMP)

venv: $(STAMP)

run: check-java $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m jobs.example

test: check-java $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest tests

bench: check-java $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) jobs/benchmark.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
