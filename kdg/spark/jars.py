"""Spark's Kafka connector at exactly the installed PySpark's version, fetched like Kafka's jars."""

from pathlib import Path

from kdg.errors import MissingComponent
from kdg.paths import cache_dir, spark_pom
from kdg.stack.jars import fetch_with_maven


def pyspark_version() -> str:
    try:
        import pyspark
    except ImportError:
        raise MissingComponent("PySpark is not installed: `pip install -e .` installs the pinned version") from None
    return pyspark.__version__


def spark_lib_dir(version: str | None = None) -> Path:
    return cache_dir() / "jars" / f"spark-kafka-{version or pyspark_version()}"


def spark_jars(echo=print) -> list[Path]:
    """The connector and its dependencies, minus jars PySpark already ships (two copies of a class
    on one classpath is how NoSuchMethodError starts)."""
    import pyspark

    version = pyspark_version()
    lib = fetch_with_maven(spark_pom(), spark_lib_dir(version), f"Spark {version} Kafka connector",
                           {"spark.version": version}, echo=echo)
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(p for p in lib.glob("*.jar") if _artifact(p.name) not in shipped)


def _artifact(jar_name: str) -> str:
    """``kafka-clients-3.9.1.jar`` → ``kafka-clients``."""
    parts = jar_name[:-len(".jar")].split("-")
    while parts and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)
