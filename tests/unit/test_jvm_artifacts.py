"""The JVM jars: declared once in jvm/pom.xml at the pinned Spark's version, found only when
fetched from the current pom, Spark's fallback coordinates read from the same pom, and a failed
fetch ends with one line that says what to do."""
from __future__ import annotations

import os
import re
import stat

import pytest

from commandline.exits import Failure
from jvm import artifacts
from support import ROOT


def test_the_connector_is_the_pinned_sparks_version():
    pinned = re.search(r'"pyspark==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    spark = {d.artifact: d for d in artifacts.dependencies(artifacts.SPARK)}
    assert spark["spark-sql-kafka-0-10_2.13"].version == pinned
    minor = ".".join(pinned.split(".")[:2])
    assert f"delta-spark_{minor}_2.13" in spark  # Delta's build for that Spark minor


def test_the_fallback_asks_spark_for_the_poms_coordinates_without_what_pyspark_ships():
    conf = artifacts.packages_conf()
    assert conf["spark.jars.packages"].split(",") == [
        d.coordinates for d in artifacts.dependencies(artifacts.SPARK)]
    assert "org.apache.hadoop:*" in conf["spark.jars.excludes"].split(",")
    # The broker's jars (another kafka-clients) never reach Spark.
    assert "kafka_2.13" not in conf["spark.jars.packages"]


def test_jars_count_only_when_fetched_from_the_current_pom(tmp_path):
    folder = tmp_path / artifacts.SPARK
    folder.mkdir()
    (folder / "a.jar").write_bytes(b"")
    assert artifacts.fetched_jars(artifacts.SPARK, tmp_path) is None  # no marker: interrupted
    (folder / artifacts.MARKER).write_text("an older pom's hash\n")
    assert artifacts.fetched_jars(artifacts.SPARK, tmp_path) is None
    (folder / artifacts.MARKER).write_text(artifacts._pom_hash() + "\n")
    assert artifacts.fetched_jars(artifacts.SPARK, tmp_path) == [folder / "a.jar"]


def test_without_jars_or_mvn_a_session_falls_back_to_sparks_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    conf = artifacts.spark_conf(tmp_path)
    assert "spark.jars" not in conf
    assert conf["spark.jars.packages"] == artifacts.packages_conf()["spark.jars.packages"]
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_a_failed_fetch_is_one_line_naming_the_log_and_the_fix(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text("#!/bin/sh\necho 'Could not transfer artifact' >&2\nexit 1\n")
    mvn.chmod(mvn.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(Failure) as caught:
        artifacts.fetch(artifacts.SPARK, tmp_path / "jars", quiet=True)
    message = caught.value.message
    assert "\n" not in message and "make jars" in message
    log = tmp_path / "jars" / f"fetch-{artifacts.SPARK}.log"
    assert str(log) in message and "Could not transfer artifact" in log.read_text()
    assert not (tmp_path / "jars" / artifacts.SPARK).exists()  # nothing half-fetched left


def test_the_deployment_guide_gives_the_poms_coordinates():
    guide = (ROOT / "docs" / "deployment.md").read_text()
    conf = artifacts.packages_conf()
    assert f"--packages {conf['spark.jars.packages']} " in guide
    assert f"--exclude-packages '{conf['spark.jars.excludes']}' " in guide
    for key, value in artifacts.DELTA_CONF.items():
        assert f"--conf {key}={value}" in guide


def test_the_environments_spark_defaults_carry_the_jars_delta_and_the_drivers_log(tmp_path):
    folder = tmp_path / "jars" / artifacts.SPARK
    folder.mkdir(parents=True)
    (folder / "delta.jar").write_bytes(b"")
    (folder / artifacts.MARKER).write_text(artifacts._pom_hash() + "\n")
    conf_dir = tmp_path / "pyspark" / "conf"
    assert artifacts.write_spark_defaults(conf_dir, tmp_path / "jars") is None
    text = (conf_dir / "spark-defaults.conf").read_text()
    settings = dict(line.split(None, 1) for line in text.splitlines() if not line.startswith("#"))
    assert settings["spark.jars"] == str(folder / "delta.jar")
    assert settings["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    log4j = settings["spark.driver.extraJavaOptions"].removeprefix("-Dlog4j2.configurationFile=")
    assert log4j == artifacts.DRIVER_LOG4J2.as_uri() and artifacts.DRIVER_LOG4J2.is_file()
    # Written again (the pom changed) over its own file, never over the user's.
    (conf_dir / "spark-defaults.conf").write_text("spark.master  yarn\n")
    note = artifacts.write_spark_defaults(conf_dir, tmp_path / "jars")
    assert "is not this project's: left as it is" in note
    assert (conf_dir / "spark-defaults.conf").read_text() == "spark.master  yarn\n"


def test_without_fetched_jars_the_defaults_ask_spark_to_resolve_the_poms_coordinates(tmp_path):
    artifacts.write_spark_defaults(tmp_path, tmp_path / "no-jars")
    text = (tmp_path / "spark-defaults.conf").read_text()
    assert f"spark.jars.packages  {artifacts.packages_conf()['spark.jars.packages']}" in text
    assert "spark.jars  " not in text


def test_help_describes_the_command_and_the_spark_submit_lines_are_labelled(capsys):
    with pytest.raises(SystemExit):
        artifacts.main(["--help"])
    shown = capsys.readouterr().out
    assert "spark-defaults.conf" in shown and ":param" not in shown
    assert artifacts.main(["--spark-submit"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["#", "--packages", "#", "--jars"]
