"""kdg: move data through Apache Kafka under a chosen delivery guarantee, and prove it held.

The Python API (:mod:`kdg.api`): :func:`consume`, :func:`produce`, :func:`audit`, :func:`spark_replay` and
:func:`spark_stream`, each the command of its name as a function, and :class:`StopToken` to stop one.

Example::

    import kdg

    report = kdg.consume("orders", group="etl", table="app.orders", until_end=True)
    print(report.processed)

Stability: public are the names in ``__all__``, the fields of the report dataclasses the functions return,
and the exceptions of :mod:`kdg.errors`. Everything else may change in any release.
"""

import sys
import types

from kdg import errors
from kdg.api import StopToken, audit, consume, produce, spark_replay, spark_stream
from kdg.errors import KdgError
from kdg.flow.transform import TransformRecord

__version__ = "0.1.0"

__all__ = [
    "AuditReport", "ConsumeReport", "GroupAudits", "KdgError", "ProduceReport", "ReplayReport", "StopToken",
    "StreamReport", "TransformRecord", "__version__", "audit", "consume", "errors", "produce", "spark_replay",
    "spark_stream",
]

# the report classes live beside the clients they report on; imported when first named, so `import kdg`
# (and `kdg --help`) loads no client library
_REPORTS = {"ConsumeReport": "kdg.consume", "ProduceReport": "kdg.produce", "AuditReport": "kdg.audit",
            "GroupAudits": "kdg.audit", "ReplayReport": "kdg.replay", "StreamReport": "kdg.spark.stream"}


class _Package(types.ModuleType):
    """The package, whose functions ``consume``, ``produce`` and ``audit`` keep their names once the modules of
    the same names (:mod:`kdg.consume`, …) are imported: Python would otherwise set each module over its
    function. The modules stay importable as ever (``from kdg.consume import ConsumeReport``)."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and name in ("consume", "produce", "audit"):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name in _REPORTS:
        import importlib

        return getattr(importlib.import_module(_REPORTS[name]), name)
    raise AttributeError(f"module 'kdg' has no attribute {name!r}")
