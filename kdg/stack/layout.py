"""The shape of a local stack: how many brokers, which ports, where its files live.

A stack writes its layout to ``stack.json`` in its state directory on ``up``; every later
command (status, down, and the default connection settings) reads it back from there.
"""

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

HOST = "127.0.0.1"
DEFAULT_BROKER_PORT = 19092
DEFAULT_PG_PORT = 15432
DEFAULT_REGISTRY_PORT = 18081  # as 19092 and 15432 are Kafka's and Postgres's own ports + 10000: 8081 + 10000
REGISTRY_API_PATH = "/apis/ccompat/v6"  # Apicurio's Confluent-compatible API
PG_USER = "kdg"
PG_DATABASE = "kdg"


@dataclass(frozen=True)
class StackLayout:
    """Ports and paths of one local stack.

    Broker ``i`` (1-based) listens for clients on ``broker_port + i - 1`` and for the
    controller quorum on ``broker_port + 100 + i - 1``. A third listener, ``FAULTY`` on
    ``broker_port + 300 + i - 1``, advertises ``broker_port + 200 + i - 1``: the port where a
    fault proxy (``kdg chaos``) listens and forwards to it, so clients that bootstrap through
    the proxy keep talking through it after the first metadata response.

    A ``secure`` stack's client and FAULTY listeners speak SASL_SSL (:mod:`kdg.stack.secure`); its
    credentials live in ``client.properties`` (the client user) and ``secure/admin.properties``.

    ``registry_port``: the HTTP port of the stack's Schema Registry (:mod:`kdg.stack.registry`), None for a
    stack without one.
    """

    state_dir: Path
    brokers: int = 3
    broker_port: int = DEFAULT_BROKER_PORT
    pg_port: int = DEFAULT_PG_PORT
    external_pg_dsn: str | None = None
    secure: bool = False
    registry_port: int | None = None

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.brokers + 1))

    def client_port(self, node: int) -> int:
        return self.broker_port + node - 1

    def controller_port(self, node: int) -> int:
        return self.broker_port + 100 + node - 1

    def proxy_port(self, node: int) -> int:
        return self.broker_port + 200 + node - 1

    def faulty_port(self, node: int) -> int:
        return self.broker_port + 300 + node - 1

    def internal_port(self, node: int) -> int:
        """The brokers' own PLAINTEXT listener of a secure stack (a plaintext stack uses the client port)."""
        return self.broker_port + 400 + node - 1

    @property
    def proxy_bootstrap(self) -> str:
        return ",".join(f"{HOST}:{self.proxy_port(n)}" for n in self.node_ids)

    @property
    def registry_url(self) -> str | None:
        """The Schema Registry's Confluent-compatible API (``schema.registry.url``), None without one."""
        return None if self.registry_port is None else f"http://{HOST}:{self.registry_port}{REGISTRY_API_PATH}"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{HOST}:{self.client_port(n)}" for n in self.node_ids)

    @property
    def controller_bootstrap(self) -> str:
        return ",".join(f"{HOST}:{self.controller_port(n)}" for n in self.node_ids)

    @property
    def replication_factor(self) -> int:
        return min(3, self.brokers)

    @property
    def min_insync_replicas(self) -> int:
        return 1 if self.brokers == 1 else 2

    @property
    def pg_dsn(self) -> str:
        return self.external_pg_dsn or f"postgresql://{PG_USER}@{HOST}:{self.pg_port}/{PG_DATABASE}"

    @property
    def uses_embedded_pg(self) -> bool:
        return self.external_pg_dsn is None

    def node_dir(self, node: int) -> Path:
        return self.state_dir / f"broker-{node}"

    @property
    def secure_dir(self) -> Path:
        return self.state_dir / "secure"

    @property
    def client_profile(self) -> Path | None:
        """The client user's librdkafka profile of a secure stack (None on a plaintext one)."""
        return self.state_dir / "client.properties" if self.secure else None

    @property
    def admin_profile(self) -> Path | None:
        """The admin user's profile, for kdg's own checks of a secure stack (None on a plaintext one)."""
        return self.secure_dir / "admin.properties" if self.secure else None

    def admin_properties(self) -> dict[str, str]:
        """What the stack's own clients (readiness, topic creation, chaos probes) connect with."""
        from kdg.profile import read_profile

        return read_profile(self.admin_profile, "stack admin profile") if self.secure else {}

    @property
    def pg_dir(self) -> Path:
        return self.state_dir / "postgres"

    def save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = asdict(self) | {"state_dir": str(self.state_dir)}
        partial = self.state_dir / f"stack.json.{os.getpid()}"  # renamed over: a reader never sees half a file
        partial.write_text(json.dumps(data, indent=2))
        partial.replace(self.state_dir / "stack.json")

    @classmethod
    def load(cls, state_dir: Path) -> "StackLayout | None":
        try:
            data = json.loads((state_dir / "stack.json").read_text())
        except FileNotFoundError:
            return None
        data["state_dir"] = Path(data["state_dir"])
        known = {f.name for f in fields(cls)}  # a newer kdg's settings are not this one's to refuse
        return cls(**{k: v for k, v in data.items() if k in known})
