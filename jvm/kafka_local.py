"""``kafka-local``: a single-node Kafka broker on 127.0.0.1 for local runs and tests, started
from the jars of ``jvm/pom.xml``'s ``kafka-broker`` profile (no tarball, no Docker).

``kafka-local start --dir DIR`` runs one JVM in KRaft mode, broker and controller in one process,
with everything under ``DIR``: its settings (``server.properties``), its data (``data/``), its log
(``broker.log``) and its process id (``broker.pid``). It returns once the broker answers a metadata
request, and prints ``bootstrap.servers=127.0.0.1:PORT`` as its last line. ``kafka-local stop
--dir DIR`` ends that process by its id and waits for it to exit. ``KAFKA_OPTS``, as for Kafka's
own scripts, holds more JVM options for the broker and its storage formatter (``make test`` gives
them the JIT's first tier, as the suite's Spark JVMs).

Starting again on the same ``DIR`` keeps its topics: the storage is formatted once, with a cluster
id kept in ``DIR``, and reused. The ports of the previous run are reused when free, otherwise new
free ports are written into ``server.properties``; the controller quorum is static
(``controller.quorum.voters``), read from that file at every start, so a new port is no change
to the cluster's metadata.
"""
from __future__ import annotations

import argparse
import base64
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Optional

from commandline.exits import ExitCode, Failure, exit_codes_help, report_failure

from . import artifacts

HOST = "127.0.0.1"
NODE_ID = 1
START_TIMEOUT = 60.0  # seconds for the JVM to start and answer; it usually takes 5-15
STOP_TIMEOUT = 60.0   # seconds for a controlled shutdown before the process is killed
HEAP = "-Xmx512m"     # a test broker holds little; Kafka's scripts default to 1 GB
TOOL_HEAP = "-Xmx256m"  # the storage formatter, a short-lived JVM beside a busy test session


def _jvm_options() -> list[str]:
    """The user's ``KAFKA_OPTS``: more JVM options, as Kafka's own scripts take them."""
    return os.environ.get("KAFKA_OPTS", "").split()


class BrokerDir:
    """The files of one broker under its directory."""

    def __init__(self, root: str):
        """The paths of the broker's files; nothing is created.

        :param root: the broker's directory.
        """
        self.root = Path(root).resolve()
        self.config = self.root / "server.properties"
        self.data = self.root / "data"
        self.log = self.root / "broker.log"
        self.pid_file = self.root / "broker.pid"
        self.cluster_id_file = self.root / "cluster.id"

    def pid(self) -> Optional[int]:
        """The recorded process id when that process is still a running broker, else ``None``."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _is_broker(pid) else None

    def cluster_id(self) -> str:
        """The cluster id of this directory, made once (Kafka's form: 16 random bytes in
        URL-safe base64, as ``kafka-storage random-uuid`` prints)."""
        if not self.cluster_id_file.is_file():
            self.cluster_id_file.write_text(new_cluster_id() + "\n")
        return self.cluster_id_file.read_text().strip()

    def previous_ports(self) -> Optional[tuple]:
        """The (broker, controller) ports of the last start, if any."""
        if not self.config.is_file():
            return None
        settings = dict(line.split("=", 1) for line in self.config.read_text().splitlines()
                        if "=" in line and not line.startswith("#"))
        try:
            listeners = dict(item.split("://") for item in settings["listeners"].split(","))
            return (int(listeners["PLAINTEXT"].rsplit(":", 1)[1]),
                    int(listeners["CONTROLLER"].rsplit(":", 1)[1]))
        except (KeyError, ValueError):
            return None


def new_cluster_id() -> str:
    """A random cluster id in Kafka's form (16 bytes, URL-safe base64, unpadded) that does not
    start with ``-``: the storage tool would read such an id as an option."""
    while True:
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not made.startswith("-"):
            return made


def _is_broker(pid: int) -> bool:
    """True when ``pid`` runs (and is not a zombie) with Kafka's main class on its command line:
    a recorded id that the system has since given to another process is not ours to signal."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and b"kafka.Kafka" in cmdline


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list:
    """``count`` distinct ports free on 127.0.0.1 now (the system's choice of ephemeral ports)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def server_properties(broker: BrokerDir, port: int, controller_port: int) -> str:
    """The broker's settings: broker and controller in one process, a static quorum of this one
    node, one replica of everything (a single node cannot have more).

    :param broker: the broker's directory.
    :param port: the clients' (PLAINTEXT) port.
    :param controller_port: the controller quorum's port.
    """
    return "\n".join([
        "# Written by kafka-local at every start; edits are overwritten.",
        "process.roles=broker,controller",
        f"node.id={NODE_ID}",
        f"controller.quorum.voters={NODE_ID}@{HOST}:{controller_port}",
        f"listeners=PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{HOST}:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={broker.data}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "",
    ])


def _java() -> str:
    from shutil import which

    java = which("java")
    if java is None:
        raise Failure(ExitCode.FAILED, "the Kafka broker needs Java 17+ and there is no 'java' on "
                                       "PATH: install a JDK 17, e.g. 'apt-get install "
                                       "openjdk-17-jre-headless'")
    return java


def _classpath() -> str:
    jars = artifacts.fetch(artifacts.BROKER)
    return os.pathsep.join(str(j) for j in jars)


def start(directory: str, timeout: float = START_TIMEOUT) -> str:
    """Start the broker of ``directory`` (formatting its storage the first time) and return its
    bootstrap address once it answers a metadata request; a broker already running there is
    left as it is and its address returned.

    :param directory: the broker's directory, created if missing.
    :param timeout: seconds to wait for the broker to answer.
    :raises Failure: no Java or jars, the broker exited, or it did not answer in time (the
        message names its log).
    """
    broker = BrokerDir(directory)
    broker.root.mkdir(parents=True, exist_ok=True)
    if broker.pid() is not None:
        ports = broker.previous_ports()
        if ports:
            return f"{HOST}:{ports[0]}"
    java, classpath = _java(), _classpath()
    ports = broker.previous_ports()
    if ports is None or not all(_free(p) for p in ports):
        ports = tuple(_free_ports(2))
    broker.config.write_text(server_properties(broker, *ports))
    if not (broker.data / "meta.properties").is_file():
        _format_storage(java, classpath, broker)
    with open(broker.log, "ab") as log:
        process = subprocess.Popen(
            [java, HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true", *_jvm_options(),
             "-Dorg.slf4j.simpleLogger.showDateTime=true",
             "-cp", classpath, "kafka.Kafka", str(broker.config)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=broker.root,
            start_new_session=True)  # outlives this command, and its terminal's Ctrl-C
    broker.pid_file.write_text(f"{process.pid}\n")
    bootstrap = f"{HOST}:{ports[0]}"
    try:
        _wait_until_ready(process, bootstrap, broker, timeout)
    except Failure:
        stop(directory)
        raise
    return bootstrap


def _format_storage(java: str, classpath: str, broker: BrokerDir) -> None:
    """Format the broker's storage with the directory's cluster id (Kafka's ``kafka-storage
    format``), its output appended to the broker's log; a failure names the tool's own last
    words, which say why (a full disk, an unwritable directory)."""
    done = subprocess.run(
        [java, TOOL_HEAP, *_jvm_options(), "-cp", classpath, "kafka.tools.StorageTool", "format",
         "-t", broker.cluster_id(), "-c", str(broker.config)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    with open(broker.log, "a") as log:
        log.write(done.stdout)
    if done.returncode != 0:
        # The tool prints its whole configuration (tab-indented) before any error.
        said = [line.strip() for line in done.stdout.splitlines()
                if line.strip() and not line.startswith("\t")]
        why = said[-1] if said else f"exit code {done.returncode}"
        raise Failure(ExitCode.FAILED, f"formatting the broker's storage under {broker.data} "
                                       f"failed: {why} (the whole output: {broker.log})")


def _wait_until_ready(process: subprocess.Popen, bootstrap: str, broker: BrokerDir,
                      timeout: float) -> None:
    """Poll until the broker lists itself in a metadata answer (it then takes requests), or
    fail at once when its process ends."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    host, port = bootstrap.rsplit(":", 1)
    admin = None
    while time.monotonic() < deadline:
        code = process.poll()
        if code is not None:
            raise Failure(ExitCode.FAILED, f"the Kafka broker exited (code {code}) before taking "
                                           f"connections; see {broker.log}")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            time.sleep(0.2)
            continue
        if admin is None:
            admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        try:
            if admin.list_topics(timeout=2).brokers:
                return
        except KafkaException:
            pass
        time.sleep(0.2)
    raise Failure(ExitCode.FAILED, f"the Kafka broker did not answer on {bootstrap} within "
                                   f"{timeout:g} s; see {broker.log}")


def stop(directory: str, timeout: float = STOP_TIMEOUT) -> Optional[int]:
    """Stop the broker of ``directory`` by its recorded process id (SIGTERM: a controlled
    shutdown; SIGKILL after ``timeout`` seconds) and wait until it has exited.

    :param directory: the broker's directory.
    :param timeout: seconds to wait for the controlled shutdown.
    :returns: the process id of the broker stopped, or ``None`` when no broker of that
        directory was running.
    """
    broker = BrokerDir(directory)
    pid = broker.pid()
    if pid is None:
        broker.pid_file.unlink(missing_ok=True)
        return None
    os.kill(pid, signal.SIGTERM)
    if not _wait_for_exit(pid, timeout):
        os.kill(pid, signal.SIGKILL)
        _wait_for_exit(pid, 10.0)
    broker.pid_file.unlink(missing_ok=True)
    return pid


def _wait_for_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:  # reap it when it is this process's child (a start() in the same process)
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not _is_broker(pid):
            return True
        time.sleep(0.1)
    return False


def main(argv: Optional[list] = None) -> int:
    """The ``kafka-local`` command.

    :param argv: the arguments (default: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(
        prog="kafka-local", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A single-node Kafka broker (KRaft) on 127.0.0.1, its data, settings, log "
                    "and process id under one directory. KAFKA_OPTS, as for Kafka's own "
                    "scripts, holds more JVM options for the broker.",
        epilog=exit_codes_help(ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE))
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("start", help="start the broker (or find it running) and print "
                                           "bootstrap.servers=HOST:PORT as the last line")
    up.add_argument("--dir", required=True, metavar="DIR",
                    help="the broker's directory; a restart on it keeps its topics")
    up.add_argument("--timeout", type=float, default=START_TIMEOUT, metavar="SECONDS",
                    help="how long to wait for the broker to answer (default: %(default)g)")
    down = commands.add_parser("stop", help="stop the broker of DIR and wait for it to exit")
    down.add_argument("--dir", required=True, metavar="DIR", help="the broker's directory")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            print(f"bootstrap.servers={start(args.dir, args.timeout)}", flush=True)
        else:
            pid = stop(args.dir)
            print(f"stopped the broker of {args.dir} (process {pid})" if pid is not None
                  else f"no broker running under {args.dir}",
                  file=sys.stdout if pid is not None else sys.stderr)
    except Failure as failure:
        return report_failure(failure)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
