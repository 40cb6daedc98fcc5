"""The secure local stack: a CA and a broker certificate, SCRAM users, ACLs and the profiles to connect with.

``kdg stack up --secure`` gives the brokers a SASL_SSL client listener (and a SASL_SSL FAULTY
listener, which the chaos proxy reaches over its own TLS while showing clients the broker
certificate, so it can still drop acknowledgements). What it makes, all in the state dir:

- ``secure/ca.pem`` (with its key ``secure/ca.key``) and ``secure/broker.pem``: one broker key and
  certificate for every node, with 127.0.0.1 and localhost as subject alternative names, so they
  are valid on the client port and on the proxy's port alike. Made with ``openssl``, once.
- SCRAM-SHA-512 users, added by Kafka's own storage tool when the nodes are formatted: ``admin``
  (a super user, kdg's own checks), ``kdg`` (the client user, allowed by ACLs on every topic,
  group and transactional id) and ``denied`` (no ACL at all: authorization is real).
- ``client.properties`` (mode 0600): librdkafka's names for the client user; ``secure/admin.properties``
  and ``secure/denied.properties`` likewise.

The controller listener and the brokers' own INTERNAL listener stay PLAINTEXT on 127.0.0.1; the
brokers authenticate there as ``User:ANONYMOUS``, a super user. So anyone who can open a loopback
port on this machine can bypass the ACLs: this stack is for trying and testing kdg, not a template
for production.
"""

import secrets
import subprocess
from pathlib import Path

from kdg.errors import MissingComponent, StackError
from kdg.stack.layout import StackLayout

MECHANISM = "SCRAM-SHA-512"
ADMIN, CLIENT, DENIED = "admin", "kdg", "denied"
USERS = (ADMIN, CLIENT, DENIED)
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def ca_path(layout: StackLayout) -> Path:
    return layout.secure_dir / "ca.pem"


def profile_of(layout: StackLayout, user: str) -> Path:
    """The librdkafka profile of ``user``: the client user's is ``client.properties`` in the state dir."""
    return layout.state_dir / "client.properties" if user == CLIENT else layout.secure_dir / f"{user}.properties"


def prepare(layout: StackLayout) -> None:
    """Certificates and passwords, made once; profiles written (mode 0600) from the passwords."""
    layout.secure_dir.mkdir(parents=True, exist_ok=True)
    layout.secure_dir.chmod(0o700)
    _ensure_certificates(layout)
    for user in USERS:
        _write_private(profile_of(layout, user), _profile_text(layout, user, _password(layout, user)))


def _password(layout: StackLayout, user: str) -> str:
    path = layout.secure_dir / f"{user}.password"
    if not path.exists():
        _write_private(path, secrets.token_urlsafe(24))
    return path.read_text().strip()


def _profile_text(layout: StackLayout, user: str, password: str) -> str:
    return (f"# the {user!r} user of the local secure stack in {layout.state_dir} (written by kdg stack up --secure)\n"
            f"security.protocol=SASL_SSL\nsasl.mechanism={MECHANISM}\n"
            f"sasl.username={user}\nsasl.password={password}\nssl.ca.location={ca_path(layout)}\n")


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (created 0600, never world-readable in between)."""
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    path.chmod(0o600)


def scram_format_args(layout: StackLayout) -> list[str]:
    """``--add-scram`` arguments for Kafka's storage tool: every user exists from the first start."""
    args = []
    for user in USERS:
        args += ["--add-scram", f"{MECHANISM}=[name={user},password={_password(layout, user)}]"]
    return args


def hide_passwords(layout: StackLayout, text: str) -> str:
    """``text`` with every stack user's password replaced by ``***`` (a tool's output may echo its arguments)."""
    if layout.secure:
        for user in USERS:
            text = text.replace(_password(layout, user), "***")
    return text


def broker_settings(layout: StackLayout, node: int, host: str) -> dict[str, object]:
    """The ``server.properties`` entries of a secure node (listeners, TLS, SASL, the authorizer)."""
    client, faulty = layout.client_port(node), layout.faulty_port(node)
    internal, controller = layout.internal_port(node), layout.controller_port(node)
    return {
        "listeners": f"SASL_SSL://{host}:{client},CONTROLLER://{host}:{controller},"
                     f"FAULTY://{host}:{faulty},INTERNAL://{host}:{internal}",
        "advertised.listeners": f"SASL_SSL://{host}:{client},FAULTY://{host}:{layout.proxy_port(node)},"
                                f"INTERNAL://{host}:{internal}",
        "inter.broker.listener.name": "INTERNAL",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT,FAULTY:SASL_SSL,INTERNAL:PLAINTEXT",
        "sasl.enabled.mechanisms": MECHANISM,
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": _SCRAM_MODULE,
        f"listener.name.faulty.{MECHANISM.lower()}.sasl.jaas.config": _SCRAM_MODULE,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": layout.secure_dir / "broker.pem",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": ca_path(layout),
        "authorizer.class.name": AUTHORIZER,
        "super.users": f"User:{ADMIN};User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    }


def grant_client_acls(layout: StackLayout) -> None:
    """Allow the client user everything on every topic, group and transactional id (idempotent)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                       ResourceType)

    from kdg.kafka.clients import admin_client

    principal = f"User:{CLIENT}"

    def allow(kind, name, op):
        return AclBinding(kind, name, ResourcePatternType.LITERAL, principal, "*", op, AclPermissionType.ALLOW)

    bindings = [allow(kind, "*", AclOperation.ALL)
                for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)]
    bindings += [allow(ResourceType.BROKER, "kafka-cluster", op)  # BROKER is librdkafka's name for the cluster
                 for op in (AclOperation.IDEMPOTENT_WRITE, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS)]
    admin = admin_client(layout.bootstrap_servers, layout.admin_properties())
    for binding, future in admin.create_acls(bindings, request_timeout=30).items():
        try:
            future.result(60)
        except KafkaException as exc:
            raise StackError(f"granting the {CLIENT!r} user {binding.operation.name} on "
                             f"{binding.restype.name} failed: {exc.args[0].str()}") from None


def _ensure_certificates(layout: StackLayout) -> None:
    d = layout.secure_dir
    if (d / "broker.pem").exists() and ca_path(layout).exists():
        return
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d / "ca.key", "-out", ca_path(layout),
             "-days", "3650", "-subj", f"/CN=kdg local stack CA {layout.state_dir.name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", d / "broker.key", "-out", d / "broker.csr",
             "-subj", "/CN=localhost")
    (d / "broker.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                  "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", d / "broker.csr", "-CA", ca_path(layout), "-CAkey", d / "ca.key",
             "-CAcreateserial", "-out", d / "broker.crt", "-days", "3650", "-extfile", d / "broker.ext")
    # Kafka's PEM keystore: the PKCS#8 key, then the certificate chain, in one file
    _write_private(d / "broker.pem", (d / "broker.key").read_text() + (d / "broker.crt").read_text()
                   + ca_path(layout).read_text())
    for name in ("broker.csr", "broker.ext"):
        (d / name).unlink(missing_ok=True)
    for name in ("ca.key", "broker.key"):
        (d / name).chmod(0o600)


def _openssl(*args: object) -> None:
    try:
        proc = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)
    except FileNotFoundError:
        raise MissingComponent("`kdg stack up --secure` makes its certificates with openssl, which is not "
                               "installed (apt-get install openssl)") from None
    if proc.returncode != 0:
        raise StackError(f"openssl {args[0]} failed making the stack's certificates: {proc.stderr.strip()}")
