"""``RecentProgress``: the updates ``StreamingQuery.recentProgress`` gives, with each update
fetched from the JVM once."""
from __future__ import annotations

from attribution.spark.query_progress import RecentProgress

# Conf of the query at its start: no idle trigger's update during the test, so that both
# readers see the same updates whenever they look.
QUERY_CONF = {"spark.sql.streaming.noDataProgressEventInterval": "1h"}


def test_the_updates_are_recent_progress_and_each_is_converted_once(spark, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    saved = {key: spark.conf.get(key) for key in QUERY_CONF}
    for key, value in QUERY_CONF.items():
        spark.conf.set(key, value)
    try:
        query = (spark.readStream.option("maxFilesPerTrigger", 1).text(str(source))
                 .writeStream.format("noop")
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    finally:
        for key, value in saved.items():
            spark.conf.set(key, value)
    try:
        recent = RecentProgress(query)
        assert recent.updates() == [] and query.recentProgress == []
        before: list = []
        for n in range(5):
            (source / f"part-{n}.txt").write_text(f"line {n}\n")
            query.processAllAvailable()
            updates = recent.updates()
            assert [u.json for u in updates] == [p.json for p in query.recentProgress]
            assert updates[-1].batchId == n and updates[-1].numInputRows == 1
            # An update converted before is the same object, not a new conversion of it.
            again = [u for u in updates if any(u.json == b.json for b in before)]
            assert again and all(any(u is b for b in before) for u in again) or n == 0
            before = updates
        assert all(u is b for u, b in zip(recent.updates(), before, strict=True))
    finally:
        query.stop()
