"""The stack's optional Schema Registry: Apicurio Registry with in-memory storage, Confluent-compatible.

``kdg stack up --schema-registry`` starts it next to the brokers on ``127.0.0.1:<registry_port>`` (saved in
the stack's layout); a Confluent client is given :func:`url`, which ends in ``/apis/ccompat/v6``. Its schemas
live in memory only: they are gone when it stops.

It is built once, like Kafka's jars are fetched: ``resources/maven/registry`` (a pom naming Apicurio's published
app, its ``application.properties``, and Maven settings that ask Maven Central only) is copied into the kdg cache
and ``mvn package`` re-packages the app there with Quarkus; the result runs with ``java -jar``. The build happens
in a ``.partial`` folder renamed when done, so an interrupted one is started again next time.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kdg.errors import MissingComponent, StackError
from kdg.paths import cache_dir, resource_path
from kdg.stack import procs
from kdg.stack.jars import require_java
from kdg.stack.layout import HOST, StackLayout

_SOURCES = ("pom.xml", "application.properties", "settings.xml")  # in resources/maven/registry
JVM_OPTIONS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]  # ~190 MB RSS, ready in 3-5 s
# the app reads generic variables (KAFKA_BOOTSTRAP_SERVERS, AUTH_ENABLED, HTTP_PORT, ...) and Quarkus any
# QUARKUS_*: the JVM gets only these from our environment, so a user's settings cannot reconfigure it
_INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TZ")


@dataclass
class RegistryStatus:
    url: str
    port: int
    pid: int | None
    up: bool


# -- the build, once per user -----------------------------------------------------------------------
def registry_version() -> str:
    """The Apicurio Registry version pinned in the shipped pom."""
    pom = resource_path("maven", "registry", "pom.xml")
    match = re.search(r"<registry.version>([^<]+)</registry.version>", pom.read_text())
    if not match:
        raise MissingComponent(f"{pom} does not pin <registry.version>")
    return match.group(1)


def build_dir() -> Path:
    """Where the registry is built, named by its version and the shipped files (an edit builds it again)."""
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update(resource_path("maven", "registry", name).read_bytes())
    return cache_dir() / "registry" / f"apicurio-{registry_version()}-{digest.hexdigest()[:12]}"


def run_jar() -> Path:
    return build_dir() / "target" / "quarkus-app" / "quarkus-run.jar"


def is_built() -> bool:
    return (build_dir() / ".complete").exists()


def ensure_built(echo=print) -> Path:
    """The registry's runnable jar, building it with Maven on first use."""
    dest = build_dir()
    if (dest / ".complete").exists():
        return run_jar()
    mvn = shutil.which("mvn")
    if not mvn:
        raise MissingComponent("Maven is needed once to build the Schema Registry: install it "
                               "(e.g. `apt-get install maven`)")
    require_java()
    echo(f"Building Apicurio Registry {registry_version()} from Maven Central into {dest} (once, ~2 minutes) ...")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "src" / "main" / "resources").mkdir(parents=True)
    shutil.copy(resource_path("maven", "registry", "pom.xml"), partial / "pom.xml")
    shutil.copy(resource_path("maven", "registry", "application.properties"),
                partial / "src" / "main" / "resources" / "application.properties")
    settings = resource_path("maven", "registry", "settings.xml")
    proc = subprocess.run([mvn, "-q", "-B", "-s", str(settings), "-f", str(partial / "pom.xml"), "package"],
                          capture_output=True, text=True)
    built = partial / "target" / "quarkus-app" / "quarkus-run.jar"
    if proc.returncode != 0 or not built.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise MissingComponent(f"Maven could not build the Schema Registry (in {partial}):\n{tail}")
    (partial / ".complete").write_text(registry_version())
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return run_jar()


# -- the server of one stack ------------------------------------------------------------------------
def url(layout: StackLayout) -> str:
    """The Confluent-compatible API's base URL, as Confluent clients take it (``schema.registry.url``)."""
    return layout.registry_url


def state_path(layout: StackLayout) -> Path:
    return layout.state_dir / "registry"


def log_path(layout: StackLayout) -> Path:
    return layout.state_dir / "logs" / "schema-registry.log"


def _pidfile(layout: StackLayout) -> Path:
    return state_path(layout) / "registry.pid"


def _tmp_dir(layout: StackLayout) -> Path:
    """The JVM's temp dir: only this server's command line names it, which tells its pid from a recycled one."""
    return state_path(layout) / "tmp"


def pid(layout: StackLayout) -> int | None:
    p = procs.read_pid(_pidfile(layout))
    return p if procs.pid_matches(p, str(_tmp_dir(layout))) else None


def answers(layout: StackLayout, timeout: float = 2.0) -> bool:
    """Whether the registry serves its Confluent API (``GET /subjects`` gives a JSON list)."""
    try:
        with urllib.request.urlopen(f"{url(layout)}/subjects", timeout=timeout) as reply:
            return isinstance(json.load(reply), list)
    except (OSError, ValueError):
        return False


def start(layout: StackLayout, echo=print) -> int:
    """Start the registry unless it runs already (building it first if need be); its pid. Does not wait."""
    if (running := pid(layout)) is not None:
        return running
    jar = ensure_built(echo)
    port = layout.registry_port
    if not procs.port_free(HOST, port):
        raise StackError(f"port {port} for the Schema Registry is taken by another process "
                         "(`kdg stack up --registry-port` chooses another)")
    _tmp_dir(layout).mkdir(parents=True, exist_ok=True)
    cmd = [require_java(), *JVM_OPTIONS, f"-Djava.io.tmpdir={_tmp_dir(layout)}",
           f"-Dquarkus.http.host={HOST}", f"-Dquarkus.http.port={port}", "-jar", str(jar)]
    env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
    return procs.start_detached(cmd, log=log_path(layout), pidfile=_pidfile(layout), env=env,
                                cwd=state_path(layout))


def wait_ready(layout: StackLayout, timeout: float = 90.0) -> None:
    """Wait until the registry answers ``GET /subjects``; a StackError with its log's tail if it dies or is late.

    A stack without a registry has nothing to wait for.
    """
    if layout.registry_port is None:
        return
    log = log_path(layout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(layout):
            return
        # by the kernel's state of the recorded pid, not by its command line: that reads empty for a moment
        # while the child is still being exec'ed into java
        if procs.process_state(procs.read_pid(_pidfile(layout))) in (None, "Z"):
            raise StackError(f"the Schema Registry exited while starting; last lines of {log}:\n{procs.tail(log)}")
        time.sleep(0.2)
    raise StackError(f"the Schema Registry did not answer {url(layout)}/subjects within {timeout:.0f}s; "
                     f"last lines of {log}:\n{procs.tail(log)}")


def up(layout: StackLayout, echo=print) -> None:
    """Start the registry of a stack that has one, without waiting (:func:`wait_ready` does); stop any left
    running by a stack that has none now."""
    if layout.registry_port is None:
        stop(layout)
    else:
        start(layout, echo)


def status(layout: StackLayout) -> RegistryStatus | None:
    """The registry (running by pid, answering its API); None for a stack without one."""
    if layout.registry_port is None:
        return None
    p = pid(layout)
    return RegistryStatus(url(layout), layout.registry_port, p, p is not None and answers(layout))


def stop(layout: StackLayout) -> bool:
    """Stop the registry by its recorded pid; True if it was running."""
    p = pid(layout)
    if p is None:
        return False
    procs.stop_pid(p, timeout=30)
    return True


def purge(layout: StackLayout) -> None:
    """Delete the registry's files in the state dir (its pid and temp dir; the schemas were in memory)."""
    shutil.rmtree(state_path(layout), ignore_errors=True)
