"""The JVM jars of the project: which they are (``pom.xml`` beside this module, the one source
of truth), fetching them with Maven into ``build/jars/<profile>/`` once, and the Spark settings
that put them on a session's classpath.

Each profile of the pom is one folder: ``spark`` (Kafka connector, Delta Lake; added to every
Spark session) and ``kafka-broker`` (the local broker's classpath, never Spark's: it brings
another ``kafka-clients``). A folder is complete when its marker file names the hash of the pom
it was fetched from, so editing the pom fetches again.

Fetching also writes Spark's defaults for this environment (``spark_defaults``): the pip-installed
pyspark's ``conf/spark-defaults.conf``, which its ``spark-submit`` reads as a Spark installation's
``conf/`` would, so that a plain ``spark-submit jobs/attribution_job.py ...`` finds Delta and the
Kafka connector, and the drivers' log stays off the terminal until the job sends it to its
``--log-file``.

Without the folder and without ``mvn``, a Spark session falls back to Spark's own resolution
(``spark.jars.packages``, which reaches Maven Central directly) with the same coordinates, read
from the pom. ``python -m jvm.artifacts`` fetches every profile (``make jars``);
``python -m jvm.artifacts --spark-submit`` prints the ``--packages`` and ``--jars`` options, for a
Spark installation of one's own.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from commandline.exits import ExitCode, Failure, report_failure

POM = Path(__file__).resolve().parent / "pom.xml"
JARS = POM.parent.parent / "build" / "jars"
SPARK = "spark"
BROKER = "kafka-broker"
MARKER = ".fetched-from"  # inside a profile's folder: the pom's hash, written last
# The drivers' log4j2 configuration in the environment's Spark defaults (``spark_defaults``).
DRIVER_LOG4J2 = POM.parent / "log4j2-driver.properties"
# The first line of a spark-defaults.conf this module wrote; a file without it is the user's own.
DEFAULTS_HEADER = "# Spark's defaults for this environment, written by python -m jvm.artifacts"
_NS = {"m": "http://maven.apache.org/POM/4.0.0"}

# What Delta needs in a session; set only when the Delta jars are on its classpath.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

# What a run may need of the ``spark`` profile -> its name in messages, and one class of its jars
# (how a JVM started without them, e.g. by spark-submit, is told apart).
SPARK_CAPABILITIES = {
    "delta": ("Delta Lake", "io.delta.sql.DeltaSparkSessionExtension"),
    "kafka": ("Spark's Kafka connector", "org.apache.spark.sql.kafka010.KafkaSourceProvider"),
}


@dataclass(frozen=True)
class Dependency:
    """One ``<dependency>`` of a profile: its coordinates and the ``group:artifact`` patterns
    (``*`` allowed) excluded from what it brings."""

    group: str
    artifact: str
    version: str
    exclusions: tuple

    @property
    def coordinates(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"


def dependencies(profile: str, pom: Path = POM) -> list:
    """The dependencies a profile of the pom declares, properties substituted.

    :param profile: a profile id of the pom (``spark`` or ``kafka-broker``).
    :param pom: the Maven project file (default: the project's).
    :raises KeyError: the pom has no such profile.
    """
    root = ET.parse(pom).getroot()
    props = {e.tag.split("}")[1]: (e.text or "").strip()
             for e in root.findall("m:properties/*", _NS)}

    def text(element, tag: str) -> str:
        value = (element.findtext(f"m:{tag}", default="", namespaces=_NS) or "").strip()
        return re.sub(r"\$\{([^}]+)\}", lambda m: props[m.group(1)], value)

    for node in root.findall("m:profiles/m:profile", _NS):
        if text(node, "id") != profile:
            continue
        return [Dependency(text(d, "groupId"), text(d, "artifactId"), text(d, "version"),
                           tuple(f"{text(x, 'groupId')}:{text(x, 'artifactId')}"
                                 for x in d.findall("m:exclusions/m:exclusion", _NS)))
                for d in node.findall("m:dependencies/m:dependency", _NS)]
    raise KeyError(f"no profile {profile!r} in {pom}")


def _pom_hash(pom: Path = POM) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def fetched_jars(profile: str, jars: Path = JARS) -> Optional[list]:
    """The jar files of a profile fetched from the current pom, or ``None`` if there are none
    (never fetched, interrupted, or fetched from an older pom).

    :param profile: a profile id of the pom.
    :param jars: the folder holding one sub-folder per profile.
    """
    folder = jars / profile
    marker = folder / MARKER
    if not marker.is_file() or marker.read_text().strip() != _pom_hash():
        return None
    return sorted(folder.glob("*.jar"))


def fetch(profile: str, jars: Path = JARS, quiet: bool = False) -> list:
    """Copy a profile's runtime jars with ``mvn`` into ``jars/<profile>/`` unless they are
    there already; returns them.

    Maven's own settings apply (mirrors, proxies), so this works wherever ``mvn`` does. The jars
    land in a scratch folder first and replace the profile's folder at once, so an interrupted
    fetch leaves nothing half-done behind.

    :param profile: a profile id of the pom.
    :param jars: the folder holding one sub-folder per profile.
    :param quiet: no line on stderr announcing the download.
    :raises Failure: ``mvn`` is missing or fails (the message says what to do).
    """
    found = fetched_jars(profile, jars)
    if found:
        return found
    mvn = shutil.which("mvn")
    if mvn is None:
        raise Failure(ExitCode.FAILED,
                      f"the JVM jars of '{profile}' are not in {jars / profile} and 'mvn' is not "
                      f"on PATH: install Maven 3.8+ (e.g. 'apt-get install maven'), then run "
                      f"'make jars'")
    jars.mkdir(parents=True, exist_ok=True)
    log = jars / f"fetch-{profile}.log"
    scratch = Path(tempfile.mkdtemp(prefix=f".{profile}-", dir=jars))
    if not quiet:
        print(f"fetching the JVM jars of '{profile}' with Maven into {jars / profile} (once)",
              file=sys.stderr)
    with open(log, "w") as out:
        done = subprocess.run(
            [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(POM), "-P", profile,
             "dependency:copy-dependencies", "-DincludeScope=runtime",
             f"-DoutputDirectory={scratch}"],
            stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise Failure(ExitCode.FAILED,
                      f"fetching the JVM jars of '{profile}' with mvn failed (exit "
                      f"{done.returncode}, see {log}): check that Maven reaches Maven Central "
                      f"(its settings.xml mirror or proxy), then run 'make jars'")
    (scratch / MARKER).write_text(_pom_hash() + "\n")
    target = jars / profile
    shutil.rmtree(target, ignore_errors=True)
    os.replace(scratch, target)
    return sorted(target.glob("*.jar"))


def spark_conf(jars: Path = JARS) -> dict:
    """The settings that give a new Spark session the ``spark`` profile's jars: ``spark.jars``
    with the fetched files (fetching them first when ``mvn`` is there), else
    ``spark.jars.packages`` and ``spark.jars.excludes`` from the pom; plus Delta's extension and
    catalog.

    :param jars: the folder holding one sub-folder per profile.
    :raises Failure: ``mvn`` is on PATH but fails.
    """
    found = fetched_jars(SPARK, jars)
    if found is None and shutil.which("mvn"):
        found = fetch(SPARK, jars)
    return _session_conf(found)


def _session_conf(found: Optional[list]) -> dict:
    """``spark.jars`` with the ``found`` jars, else Spark's own resolution of the pom's
    coordinates (``packages_conf``); with Delta's extension and catalog."""
    conf = {"spark.jars": ",".join(str(j) for j in found)} if found else packages_conf()
    conf.update(DELTA_CONF)
    return conf


def packages_conf() -> dict:
    """Spark's own resolution of the ``spark`` profile: its coordinates, and the union of its
    exclusions (what pyspark ships), for ``spark.jars.packages`` / ``--packages``."""
    deps = dependencies(SPARK)
    excludes = sorted({x for d in deps for x in d.exclusions})
    return {"spark.jars.packages": ",".join(d.coordinates for d in deps),
            "spark.jars.excludes": ",".join(excludes)}


def spark_submit_options(jars: Path = JARS) -> list:
    """The two ways to give ``spark-submit`` the jars, as lines: ``--packages`` (a machine that
    reaches Maven Central) and ``--jars`` (the fetched folder).

    :param jars: the folder the jars were fetched to.
    """
    packages = packages_conf()
    folder = jars / SPARK
    names = sorted(j.name for j in (fetched_jars(SPARK, jars) or []))
    listed = ",".join(str(folder / n) for n in names) or f"{folder}/<each jar>"
    delta = " ".join(f"--conf {k}={v}" for k, v in DELTA_CONF.items())
    return [f"--packages {packages['spark.jars.packages']} "
            f"--exclude-packages '{packages['spark.jars.excludes']}' {delta}",
            f"--jars {listed} {delta}"]


def missing_capabilities(jvm, needs) -> list:
    """The names of the capabilities in ``needs`` whose jars the running JVM lacks.

    :param jvm: py4j's view of the JVM (``SparkContext._jvm``).
    :param needs: keys of ``SPARK_CAPABILITIES``.
    """
    loadable = jvm.org.apache.spark.util.Utils.classIsLoadable
    return [SPARK_CAPABILITIES[need][0] for need in sorted(needs)
            if not loadable(SPARK_CAPABILITIES[need][1])]


def spark_conf_dir() -> Optional[Path]:
    """The ``conf`` folder of the pyspark this interpreter imports: where its ``spark-submit``
    (and every session PySpark starts) reads ``spark-defaults.conf`` unless ``SPARK_CONF_DIR``
    or ``SPARK_HOME`` point elsewhere; ``None`` without pyspark."""
    from importlib.util import find_spec

    spec = find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "conf"


def spark_defaults(jars: Path = JARS) -> str:
    """The text of the environment's ``spark-defaults.conf``: the ``spark`` profile's jars (the
    fetched files, else Spark's own resolution of the pom's coordinates), Delta's extension and
    catalog, and the drivers' JVM option naming ``DRIVER_LOG4J2``, which keeps what a driver
    logs before its job starts (a JVM started by spark-submit) to errors.

    :param jars: the folder holding one sub-folder per profile.
    """
    conf = _session_conf(fetched_jars(SPARK, jars))
    conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={DRIVER_LOG4J2.as_uri()}"
    lines = [DEFAULTS_HEADER,
             "# from jvm/pom.xml, and again whenever it changes; a file without the line above is",
             "# never overwritten. Delete it to return to Spark's own defaults.",
             *(f"{key}  {value}" for key, value in conf.items())]
    return "\n".join(lines) + "\n"


def write_spark_defaults(conf_dir: Optional[Path], jars: Path = JARS) -> Optional[str]:
    """Write ``spark_defaults`` into ``conf_dir/spark-defaults.conf`` unless a file of the
    user's own is there (one not starting with ``DEFAULTS_HEADER``).

    :param conf_dir: the folder (``spark_conf_dir``); ``None``: nothing to write.
    :param jars: the folder holding one sub-folder per profile.
    :returns: a note for the user when the file was left alone, else ``None``.
    """
    if conf_dir is None:
        return None
    target = conf_dir / "spark-defaults.conf"
    if target.exists() and not target.read_text().startswith(DEFAULTS_HEADER):
        return (f"note: {target} is not this project's: left as it is; spark-submit needs the "
                "options 'python -m jvm.artifacts --spark-submit' prints")
    conf_dir.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(target.name + ".tmp")
    scratch.write_text(spark_defaults(jars))
    os.replace(scratch, target)
    return None


DESCRIPTION = """\
Fetch the project's JVM jars (jvm/pom.xml) with Maven into build/jars/ once: the 'spark' profile
(Spark's Kafka connector, Delta Lake) and the 'kafka-broker' profile (the local broker of
kafka-local). Then write this environment's Spark defaults (pyspark's conf/spark-defaults.conf):
the jars, Delta's settings, and the drivers' log settings, so that a plain spark-submit in the
environment runs the jobs. This is what 'make jars' runs."""


def main(argv: Optional[list] = None) -> int:
    """``python -m jvm.artifacts``: fetch every profile's jars and write the environment's Spark
    defaults (``make jars``), or with ``--spark-submit`` print the spark-submit options.

    :param argv: the arguments (default: ``sys.argv[1:]``).
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m jvm.artifacts", description=DESCRIPTION)
    parser.add_argument("--spark-submit", action="store_true",
                        help="print, labelled, the two ways to give a Spark installation of your "
                             "own the jars: spark-submit's --packages options (a machine that "
                             "reaches Maven Central) and its --jars options (the fetched files)")
    args = parser.parse_args(argv)
    if args.spark_submit:
        packages, listed = spark_submit_options()
        print(f"# a machine that reaches Maven Central:\n{packages}\n"
              f"# or the jars fetched into {JARS / SPARK}:\n{listed}")
        return ExitCode.OK
    if shutil.which("mvn") is None and not all(fetched_jars(p) for p in (SPARK, BROKER)):
        print("note: no 'mvn' on PATH: Spark sessions fetch their jars themselves "
              "(spark.jars.packages); the local Kafka broker (kafka-local) needs Maven 3.8+",
              file=sys.stderr)
    else:
        try:
            for profile in (SPARK, BROKER):
                fetch(profile)
        except Failure as failure:
            return report_failure(failure)
    note = write_spark_defaults(spark_conf_dir())
    if note:
        print(note, file=sys.stderr)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
