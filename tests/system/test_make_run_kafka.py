"""``make run-kafka``'s module, run as a command on a small example: the job reads the events
from a topic of the broker the example starts, writes its rows to an output topic, the rows read
back by the consumer's rule equal the batch oracle's, and the broker is stopped at the end (no
process of its directory is left)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from jvm.kafka_local import BrokerDir
from support import ROOT
from support.commands import assert_no_traceback, command_environment


def _processes_of(config: Path) -> list[int]:
    """The processes whose command line names the broker's settings file: that broker's JVM."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if b"kafka.Kafka" in cmdline and str(config).encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_the_kafka_example_matches_the_oracle_and_stops_its_broker(tmp_path):
    out = tmp_path / "example-kafka"
    result = subprocess.run([sys.executable, "-m", "jobs.example_kafka", "--out", str(out),
                             "--users", "40", "--files", "4"],
                            capture_output=True, text=True, check=False, cwd=ROOT,
                            env=command_environment(), timeout=1200)
    broker = BrokerDir(out / "broker")
    leftovers = _processes_of(broker.config)

    assert result.returncode == 0, result.stderr[-3000:]
    assert_no_traceback(result.stderr)
    verdict = re.search(r"matches batch oracle: (\S+) \((\d+) rows vs (\d+) from the oracle "
                        r"over the \d+ records not late; (\d+) late records", result.stdout)
    assert verdict, result.stdout[-3000:]
    assert verdict[1] == "yes" and int(verdict[2]) == int(verdict[3]) > 0, verdict[0]
    # The records Spark dropped are those the audit re-read from the broker and listed.
    dropped = re.search(r"late dropped\s*: (\d+)", result.stdout)
    assert dropped and dropped[1] == verdict[4], result.stdout[-3000:]
    assert "produced" in result.stderr and "topic events" in result.stderr
    assert broker.config.is_file(), "the example ran no broker under <out>/broker"
    assert not broker.pid_file.exists() and leftovers == [], leftovers
