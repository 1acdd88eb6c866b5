"""The performance benchmark: attribution throughput, memory and state against Spark's own ceiling.

    python -m benchmarks.streaming                     # 1,000,000 events, 3 interleaved repeats
    python -m benchmarks.streaming --profile realistic # one day of events, minutes per batch
    spark-submit benchmarks/streaming/__main__.py --events 250000 --repeats 1
    python -m benchmarks.streaming --scale             # 250k, 500k and 1M: how cost grows
    python -m benchmarks.streaming --state-growth      # long horizon: state with and without GC
    python -m benchmarks.streaming --join              # the click-through join, every strategy
    python -m benchmarks.streaming --models all        # every attribution model in each run
    python -m benchmarks.streaming --allowed-lateness '0,1 hour'  # each stream run at both
    make bench-sustainable                             # highest rate each query keeps up with
    python -m benchmarks.streaming --cost-model        # seconds per micro-batch: events, state

One dataset per size is generated with the project's generator (Parquet, which Spark decodes far
faster than JSON lines, so the input format does not hide the stateful work), in ``--files``
arrival-ordered files plus a trailing heartbeat, as the ``--profile`` says (``datasets.PROFILES``:
``standard``, the generator's defaults, weeks of event time per micro-batch; ``realistic``, one
day of events, minutes per micro-batch, as a live stream's). Then, in this one process and on
those same files, it runs:

* (a) ``native``: Spark's own stateful aggregation, a count per user per 10-minute event-time
  window, append mode, with the job's watermark and file batching: the engine ceiling;
* (b) ``bare``: the attribution query alone (file source, stateful stage, Parquet sink; no
  validation, no dead-letter query); the attribution job streaming with ``available-now``
  into Parquet, once per backend; with the default backend, once more writing a Delta table
  (``delta``), and once more reading the same
  events from a Kafka topic (``kafka``: a local broker started under the work directory, each
  dataset produced to a topic of one partition before the runs, ``maxOffsetsPerTrigger``
  making as many micro-batches as the files do); the table prints the ratio of each to the
  same query on the files into Parquet;
* (c) the attribution job in batch mode;
* (d) ``core``: the pure-Python core (``attribute_batch``) over the events read with pyarrow.

Runs are interleaved (each repeat rotates the order) and each runs in a fresh checkpoint
directory; the table quotes medians. Events/s is input records over the wall time of the query,
from its start (planning included) to its end; the Spark session is started once, beforehand.
A background thread samples the resident memory of the Spark JVM, the Python workers and this
driver process from ``/proc`` every ``--sample-interval`` seconds; the peaks are per run (the
JVM never returns its heap, so its peak carries over from earlier runs). State rows and state
store size are read from the last micro-batch's ``stateOperators``. Every run is checked against
the core's answer (goal and attributed counts; native: the counts sum to the events of the
windows the final watermark closed).

Modules: ``cli`` (arguments, the run of every mode asked for), ``modes`` (main table, scale,
state growth, levers, join), ``sustainable`` (the sustainable-throughput mode, fed live by the
load generator: its definitions are in its docstring), ``cost_model`` (the cost model per
job layout, the state-scaling check and the sizing table: its definitions are in its
docstring), ``runs`` (one timed run of one kind), ``datasets`` (generating the
input and the facts runs are checked against), ``report`` (summaries, tables, formatting),
``listeners`` (micro-batch progress and state figures), ``sampling`` (memory and CPU from
``/proc``), ``kinds`` (what runs, and its labels), ``topics`` (the Kafka source's broker and
topics).
"""
