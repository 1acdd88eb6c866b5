"""``RecentProgress``: the updates ``StreamingQuery.recentProgress`` gives, with each update
fetched from the JVM once."""
from __future__ import annotations

from attribution.spark.query_progress import RecentProgress


def test_the_updates_are_recent_progress_and_each_is_converted_once(spark, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    query = (spark.readStream.option("maxFilesPerTrigger", 1).text(str(source))
             .writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        recent = RecentProgress(query)
        before: list = []
        for n in range(6):
            if n:
                (source / f"part-{n - 1}.txt").write_text(f"line {n - 1}\n")
                query.processAllAvailable()
            updates = recent.updates()
            # Spark's own list, read right after: the same updates, and perhaps an idle
            # trigger's that came in between.
            spark_s = [p.json for p in query.recentProgress]
            assert [u.json for u in updates] == spark_s[:len(updates)]
            assert len(spark_s) <= len(updates) + 1
            if n:
                assert any(u.batchId == n - 1 and u.numInputRows == 1 for u in updates)
            # An update converted before is the same object, not a new conversion of it.
            again = [u for u in updates if any(u.json == b.json for b in before)]
            assert len(again) == len(before)
            assert all(any(u is b for b in before) for u in again)
            before = updates
        assert sum(u.numInputRows for u in before) == 5
    finally:
        query.stop()
