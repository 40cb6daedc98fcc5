"""Fetch pinned jars from Maven Central, once, into the kdg cache (Kafka here; Spark's connector reuses it)."""

import re
import shutil
import subprocess
from pathlib import Path

from kdg.errors import MissingComponent
from kdg.paths import cache_dir, kafka_pom


def kafka_version() -> str:
    """The Kafka version pinned in the shipped ``resources/maven/kafka-pom.xml``."""
    pom = kafka_pom()
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
    return fetch_with_maven(kafka_pom(), kafka_lib_dir(), f"Apache Kafka {kafka_version()}", echo=echo)


def fetch_with_maven(pom: Path, dest: Path, what: str, properties: dict[str, str] | None = None,
                     echo=print) -> Path:
    """Copy the runtime dependencies ``pom`` declares into ``dest`` once; ``dest`` only appears complete.

    Maven downloads into a ``.partial`` sibling that is renamed when every jar is there, so an
    interrupted fetch is retried next time instead of leaving half a classpath.
    """
    if (dest / ".complete").exists():
        return dest
    mvn = shutil.which("mvn")
    if not mvn:
        raise MissingComponent(f"Maven is needed once to fetch {what} jars: install it (e.g. `apt-get install maven`)")
    echo(f"Fetching {what} jars from Maven Central into {dest} (once) ...")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
           f"-DoutputDirectory={partial}", "-DincludeScope=runtime",
           *(f"-D{k}={v}" for k, v in (properties or {}).items())]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise MissingComponent(f"Maven could not fetch {what} jars:\n{tail}")
    (partial / ".complete").write_text(what)
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return dest


def java_classpath() -> str:
    return str(ensure_kafka_jars() / "*")
