"""librdkafka's security properties in the Java Kafka client's words, for Spark's Kafka source.

A profile (``-F``) speaks librdkafka; Spark's source is a Java client, which ignores names it does
not know and then hangs on a listener it cannot talk to. So :func:`java_security` translates what
has a faithful Java equivalent and refuses the rest by name, before a job starts:

==============================================  ===============================================
librdkafka                                      Java client (``kafka.`` prefix added by the caller)
==============================================  ===============================================
``security.protocol``                           ``security.protocol`` (upper case)
``sasl.mechanism(s)`` PLAIN, SCRAM-SHA-256/512  ``sasl.mechanism``, and ``sasl.jaas.config`` built
``sasl.username``, ``sasl.password``            from the user and password (Plain/ScramLoginModule)
``ssl.ca.location`` (a PEM file)                ``ssl.truststore.type=PEM``, ``ssl.truststore.location``
``ssl.ca.pem``                                  ``ssl.truststore.type=PEM``, ``ssl.truststore.certificates``
``ssl.endpoint.identification.algorithm``       the same (``none`` becomes an empty value)
==============================================  ===============================================

Refused: GSSAPI (Kerberos) and OAUTHBEARER logins, client certificates (``ssl.key.location`` …)
and any other ``sasl.*``/``ssl.*`` property — each needs settings kdg cannot derive faithfully.
"""

from pathlib import Path

from kdg.errors import UsageError

_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
            "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
            "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
_PROTOCOLS = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
_TRANSLATED = {"security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
               "ssl.ca.location", "ssl.ca.pem", "ssl.endpoint.identification.algorithm"}


def is_security(key: str) -> bool:
    return key == "security.protocol" or key.startswith(("sasl.", "ssl.", "ssl_"))


def java_security(props: dict[str, object]) -> dict[str, str]:
    """The Java client's properties for the security part of ``props`` (librdkafka names); refuses the rest."""
    given = {k: str(v) for k, v in props.items() if is_security(k)}
    untranslatable = sorted(set(given) - _TRANSLATED)
    if untranslatable:
        _refuse(untranslatable[0], "has no translation kdg can vouch for (client certificates, Kerberos and "
                                   "librdkafka-only settings are not passed to Java)")
    protocol = given.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        _refuse("security.protocol", f"{given['security.protocol']!r} is not one of {', '.join(sorted(_PROTOCOLS))}")
    java: dict[str, str] = {"security.protocol": protocol} if "security.protocol" in given else {}
    if protocol.startswith("SASL"):
        java.update(_sasl(given))
    elif any(k.startswith("sasl.") for k in given):
        _refuse(min(k for k in given if k.startswith("sasl.")), f"means nothing with security.protocol={protocol}")
    if protocol.endswith("SSL"):
        java.update(_ssl(given))
    elif any(k.startswith("ssl.") for k in given):
        _refuse(min(k for k in given if k.startswith("ssl.")), f"means nothing with security.protocol={protocol}")
    return java


def _sasl(given: dict[str, str]) -> dict[str, str]:
    mechanism = given.get("sasl.mechanism", given.get("sasl.mechanisms", "GSSAPI")).upper()
    key = "sasl.mechanism" if "sasl.mechanism" in given or "sasl.mechanisms" not in given else "sasl.mechanisms"
    if mechanism not in _MODULES:
        _refuse(key, f"{mechanism}: Spark's source gets PLAIN and SCRAM logins only (GSSAPI and OAUTHBEARER "
                     "need a JAAS setup of their own)")
    for needed in ("sasl.username", "sasl.password"):
        if needed not in given:
            _refuse(needed, f"is needed to build the Java client's sasl.jaas.config for {mechanism}")
    jaas = (f'{_MODULES[mechanism]} required username="{_jaas_quote(given["sasl.username"])}" '
            f'password="{_jaas_quote(given["sasl.password"])}";')
    return {"sasl.mechanism": mechanism, "sasl.jaas.config": jaas}


def _ssl(given: dict[str, str]) -> dict[str, str]:
    java: dict[str, str] = {}
    if "ssl.ca.location" in given:
        location = Path(given["ssl.ca.location"]).expanduser()
        if not location.is_file():
            _refuse("ssl.ca.location", f"{location}: Spark's source needs one PEM file of CA certificates "
                                       "(not a directory, not 'probe')")
        java.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": str(location.resolve())})
    if "ssl.ca.pem" in given:
        java.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": given["ssl.ca.pem"]})
    if "ssl.endpoint.identification.algorithm" in given:
        value = given["ssl.endpoint.identification.algorithm"].lower()
        java["ssl.endpoint.identification.algorithm"] = "" if value == "none" else value
    return java


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _refuse(key: str, why: str) -> None:
    raise UsageError(f"spark-replay cannot pass {key} to Spark's Java Kafka client: {why}")
