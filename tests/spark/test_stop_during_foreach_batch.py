"""A stop that lands while a ``foreachBatch`` function (the Delta changelog's writer) runs is a
clean stop: the function's interrupted JVM call is raised as ``InterruptedBatch``
(``attribution.spark.sinks.interruption``), Spark reads it as the stop, and the micro-batch is
left uncommitted for a restart to run again.

Without the wrapper Spark matches the interrupted call's whole Java stack trace against its
regular expression and its query thread dies of a ``StackOverflowError`` (printed on the
driver's terminal); its status message then never becomes ``Stopped``.

The stop lands at a known point: the function waits, on the query's own thread (PySpark's pinned
thread mode runs its JVM calls there), until ``stop()`` has interrupted that thread, and only
then makes a JVM call that checks the interrupt.
"""
from __future__ import annotations

import threading
import time

from attribution.spark.sinks.interruption import (
    MAX_LINE,
    InterruptedBatch,
    stop_safe,
    without_stack_frames,
)


def test_a_stop_during_the_write_is_a_clean_stop_and_the_batch_stays_uncommitted(spark,
                                                                               tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    (events / "part-0.txt").write_text("".join(f"line {i}\n" for i in range(1000)))
    entered = threading.Event()
    raised = []
    java_thread = spark.sparkContext._jvm.java.lang.Thread

    def write(batch, batch_id):
        entered.set()
        while not java_thread.currentThread().isInterrupted():  # the query's, until stop()
            time.sleep(0.05)
        # A JVM call that checks the interrupt, as a write's waits do (a quick write may finish
        # before it waits at all).
        java_thread.sleep(1)
        batch.write.mode("append").parquet(str(tmp_path / "out"))

    safe = stop_safe(write)

    def observed(batch, batch_id):
        try:
            safe(batch, batch_id)
        except Exception as error:
            raised.append(error)
            raise

    checkpoint = tmp_path / "checkpoint"
    query = (spark.readStream.text(str(events)).writeStream.foreachBatch(observed)
             .option("checkpointLocation", str(checkpoint)).start())
    try:
        assert entered.wait(300), "the micro-batch never reached its writer"
    finally:
        query.stop()  # lands during the write: the writer waits for it

    assert [type(error) for error in raised] == [InterruptedBatch]
    message = str(raised[0])
    assert message.startswith("py4j.protocol.Py4JJavaError: An error occurred while calling ")
    assert "\tat " not in message and len(message) < 1000
    assert query.exception() is None
    assert query.status["message"] == "Stopped"
    assert (checkpoint / "offsets" / "0").exists()
    assert not (checkpoint / "commits" / "0").exists()  # run again on restart


def test_an_error_other_than_a_stop_passes_unchanged(spark, tmp_path):
    from py4j.protocol import Py4JJavaError

    def write(batch, batch_id):
        batch.sparkSession._jvm.java.lang.Class.forName("no.such.Class")

    frame = spark.range(1)
    try:
        stop_safe(write)(frame, 0)
    except Py4JJavaError as error:
        assert "java.lang.ClassNotFoundException: no.such.Class" in str(error)
        assert "\tat " in str(error)  # its stack trace kept
    else:
        raise AssertionError("the error was swallowed")


def test_without_stack_frames_keeps_the_messages_of_the_exception_and_its_causes():
    text = ("An error occurred while calling o81.save.\n"
            ": org.apache.spark.SparkException: Job 3 cancelled part of cancelled job group r-1\n"
            "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(x.scala:1)\n"
            "\tSuppressed: java.lang.IllegalStateException: closed\n"
            "\t\tat a.B.c(B.java:2)\n"
            "Caused by: java.lang.InterruptedException: " + "x" * 1000 + "\n"
            "\tat java.base/java.lang.Object.wait0(Native Method)\n"
            "\t... 42 more\n")

    assert without_stack_frames(text).splitlines() == [
        "An error occurred while calling o81.save.",
        ": org.apache.spark.SparkException: Job 3 cancelled part of cancelled job group r-1",
        ("Caused by: java.lang.InterruptedException: " + "x" * 1000)[:MAX_LINE],
    ]
