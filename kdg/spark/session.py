"""The SparkSession a replay runs in: the connector jars, task retries as the policy says, quiet logs.

``local[*]`` by default; any ``--master`` works. Off the local master, executors run this package's
code, so kdg ships itself to them as a zip (``addPyFile``); the compiled libraries it needs there
(asyncpg, pyarrow) must be installed on the executors — see the README.
"""

import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

from kdg.errors import UsageError
from kdg.paths import PROJECT_ROOT
from kdg.spark.jars import spark_jars
from kdg.stack.jars import require_java

TASK_ATTEMPTS = 4  # Spark's own default for spark.task.maxFailures on a cluster
_OWNED = {"spark.task.maxFailures"}
_LOCAL = re.compile(r"^local(\[(\*|\d+)(,\s*\d+)?\])?$")
_QUIET_LOG4J = PROJECT_ROOT / "kdg" / "resources" / "spark-log4j2.properties"


def master_url(master: str, task_retries: bool) -> str:
    """``local[N]`` gets its task-attempt count from the policy (local mode never retries otherwise).

    >>> master_url("local[*]", True)
    'local[*,4]'
    """
    match = _LOCAL.match(master.strip())
    if not match:
        return master
    threads = match.group(2) or "1"
    return f"local[{threads},{TASK_ATTEMPTS}]" if task_retries else f"local[{threads}]"


def check_conf(conf: dict[str, str]) -> None:
    """Refuse Spark properties the guarantee owns (asked before anything runs or is recorded)."""
    owned = sorted(_OWNED & set(conf))
    if owned:
        raise UsageError(f"--conf {owned[0]} is refused: the guarantee decides whether a failed task is retried")


def spark_session(master: str, *, task_retries: bool, conf: dict[str, str] | None = None, echo=print):
    """A SparkSession for one replay. The caller stops it."""
    require_java()
    jars = spark_jars(echo=echo)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master_url(master, task_retries)).appName("kdg spark-replay")
               .config("spark.jars", ",".join(str(j) for j in jars))
               .config("spark.task.maxFailures", str(TASK_ATTEMPTS if task_retries else 1))
               .config("spark.sql.mapKeyDedupPolicy", "LAST_WIN")   # repeated header names: last wins, as in consume
               .config("spark.ui.showConsoleProgress", "false")     # kdg draws its own progress
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_QUIET_LOG4J}")
               )
    # Python workers run this interpreter (its venv has kdg, asyncpg and pyarrow) unless told otherwise
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if fault := os.environ.get("KDG_FAULT"):
        builder = builder.config("spark.executorEnv.KDG_FAULT", fault)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not _LOCAL.match(master.strip()):
        spark.sparkContext.addPyFile(str(_package_zip()))
    return spark


def _package_zip() -> Path:
    """This very kdg package as a zip, so executors run the driver's code, not some other version."""
    package = PROJECT_ROOT / "kdg"
    target = Path(tempfile.mkdtemp(prefix="kdg-pyfiles-")) / "kdg.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in package.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                zf.write(path, path.relative_to(PROJECT_ROOT))
    return target
