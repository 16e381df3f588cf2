"""Where the MQTT broker is and how to log in: one ``broker`` section that central and
every edge share (``MODELFLEET_BROKER__HOST``, ``…__PORT``, ``…__TLS__ENABLED``...).

Before it, each deployable named the same connection its own way (``mqtt.host`` on
central, ``heartbeat.broker_host`` on an edge), so a fleet's two configs drifted apart
silently: a topic prefix or TLS switch set on one side only. The old names still work
for one release (``fleetwire.deprecated``). What differs per deployable stays in its own
section: liveness thresholds on central, the heartbeat interval on an edge."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from fleetwire.mqtt.tls import MqttTlsSettings
from fleetwire.mqtt.topics import DEFAULT_PREFIX

__all__ = ["BrokerSettings"]


#: The connection fields central's ``mqtt`` and the edge's ``heartbeat`` sections each had
#: before ``broker`` (their deprecated names map onto these, one release).
MOVED_CONNECTION_FIELDS = (
    "username", "password", "tls", "topic_prefix", "keepalive_s", "client_id", "reconnect_min_s", "reconnect_max_s",
)  # fmt: skip


class BrokerSettings(BaseModel):
    """The MQTT broker of the fleet and this process's login there (``MODELFLEET_BROKER__*``)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    host: str = Field("127.0.0.1", min_length=1)
    """Broker host name or address."""
    port: int = Field(1883, ge=1, le=65535)
    """Broker port (usually 1883, or 8883 for its TLS listener)."""
    hosts: list[str] = Field(default_factory=list)
    """Several brokers of one fleet, as ``host:port`` (``[v6]:port``; without a port, ``port``),
    e.g. ``MODELFLEET_BROKER__HOSTS='["10.0.0.1:1883","10.0.0.2:1883"]'`` (a JSON list).
    When set it wins over ``host``: the client starts on the first and moves to the next one
    whenever a connect fails or its connection is lost (``fleetwire.mqtt.rotation``). Setting
    ``host`` as well is an error, so a config never says two things. Empty: just ``host:port``."""
    username: str | None = None
    """Broker user name (None: anonymous). Under the shipped Mosquitto ACL central logs in as
    ``central`` (the only user that may publish ``…/central/#`` and ``…/events``) and an edge
    as its node id (it may publish only under ``…/nodes/{its user name}/``)."""
    password: SecretStr | None = None
    """Broker password (``MODELFLEET_BROKER__PASSWORD``)."""
    tls: MqttTlsSettings = Field(default_factory=MqttTlsSettings)
    """MQTT over TLS (off by default): the broker's certificate and host name are verified."""
    topic_prefix: str = Field(DEFAULT_PREFIX, min_length=1)
    """Prefix of every fleet topic; central and its edges must use the same one."""
    keepalive_s: int | None = Field(None, ge=1, le=65535)
    """MQTT keep-alive in whole seconds; the broker publishes a client's Last Will about 1.5 × this
    after it goes silent. None: central uses 10, an edge ``max(2, ceil(2 × heartbeat.interval_s))``."""
    client_id: str | None = None
    """MQTT client id of an anonymous connection; None: ``modelfleet-central-<random>`` on central,
    ``edge-<node id>`` on an edge. With a ``username`` the client id is the user name, whatever this
    says: the shipped brokers bind client ids to logins (``use_username_as_clientid true``), so nobody
    can close another client's session (and have the broker publish its Last Will) under its id."""
    reconnect_min_s: float = Field(0.5, gt=0)
    """First wait before reconnecting after losing the broker; doubles per failed attempt. Each wait
    is jittered down to as little as half of it, so a fleet does not come back in lockstep."""
    reconnect_max_s: float = Field(10.0, gt=0)
    """Longest wait between reconnect attempts."""

    @model_validator(mode="after")
    def _ordered(self) -> BrokerSettings:
        if self.reconnect_min_s > self.reconnect_max_s:
            raise ValueError("broker.reconnect_min_s must not exceed broker.reconnect_max_s")
        if self.hosts and "host" in self.model_fields_set:
            raise ValueError("set broker.host or broker.hosts, not both (hosts wins; host is the one-broker form)")
        self.addresses()  # every entry parses, or start-up fails here
        return self

    def addresses(self) -> list[tuple[str, int]]:
        """The brokers to try, in order: ``hosts`` parsed, else the one ``(host, port)``."""
        if not self.hosts:
            return [(self.host, self.port)]
        return [_parse_address(entry, self.port) for entry in self.hosts]

    def effective_keepalive_s(self, default: int) -> int:
        """The keep-alive sent in CONNECT: ``keepalive_s``, else the deployable's ``default``."""
        return self.keepalive_s if self.keepalive_s is not None else default

    def effective_client_id(self, default: str) -> str:
        """The MQTT client id: the user name when there is one (what a broker with
        ``use_username_as_clientid`` makes of it anyway), else ``client_id``, else ``default``."""
        return self.username or self.client_id or default

    def url_of(self, host: str, port: int) -> str:
        """``mqtt(s)://host:port`` of one broker, for logs."""
        shown = f"[{host}]" if ":" in host else host
        return f"{'mqtts' if self.tls.enabled else 'mqtt'}://{shown}:{port}"

    @property
    def url(self) -> str:
        """``mqtt(s)://host:port`` (comma-separated when there are several ``hosts``), for logs."""
        return ",".join(self.url_of(h, p) for h, p in self.addresses())


def _parse_address(entry: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` → ``(host, port)``; ValueError if not."""
    text = entry.strip()
    host, port_text = text, ""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"broker.hosts entry {entry!r}: expected [v6-address]:port")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:
        raise ValueError(f"broker.hosts entry {entry!r}: write an IPv6 address as [address]:port")
    if not host:
        raise ValueError(f"broker.hosts entry {entry!r}: no host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"broker.hosts entry {entry!r}: port must be 1-65535")
    return host, int(port_text)
