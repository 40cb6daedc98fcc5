"""Fetch the pinned Apache Kafka jars from Maven Central, once, into the kdg cache."""

import re
import shutil
import subprocess
from pathlib import Path

from kdg.errors import MissingComponent
from kdg.paths import KAFKA_POM, cache_dir


def kafka_version(pom: Path = KAFKA_POM) -> str:
    """The Kafka version pinned in ``compose/pom.xml``."""
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom.read_text())
    if not match:
        raise MissingComponent(f"{pom} does not pin <kafka.version>")
    return match.group(1)


def kafka_lib_dir() -> Path:
    return cache_dir() / "jars" / f"kafka-{kafka_version()}"


def has_kafka_jars() -> bool:
    return (kafka_lib_dir() / ".complete").exists()


def require_java() -> str:
    """Path of ``java`` (17+), or a clear error."""
    java = shutil.which("java")
    if not java:
        raise MissingComponent("Java 17+ is needed to run Kafka: install it (e.g. `apt-get install openjdk-17-jre-headless`)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)', out)
    if match and int(match.group(1)) < 17:
        raise MissingComponent(f"Kafka 4 needs Java 17+, found: {out.splitlines()[0]}")
    return java


def ensure_kafka_jars(echo=print) -> Path:
    """Return the directory of Kafka's jars, fetching them with Maven on first use."""
    lib = kafka_lib_dir()
    if has_kafka_jars():
        return lib
    mvn = shutil.which("mvn")
    if not mvn:
        raise MissingComponent("Maven is needed once to fetch Kafka's jars: install it (e.g. `apt-get install maven`)")
    echo(f"Fetching Apache Kafka {kafka_version()} jars from Maven Central into {lib} (once) ...")
    partial = lib.with_name(lib.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = [mvn, "-q", "-B", "-f", str(KAFKA_POM), "dependency:copy-dependencies",
           f"-DoutputDirectory={partial}", "-DincludeScope=runtime"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise MissingComponent(f"Maven could not fetch Kafka's jars:\n{tail}")
    (partial / ".complete").write_text(kafka_version())
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)
    return lib


def java_classpath() -> str:
    return str(ensure_kafka_jars() / "*")
