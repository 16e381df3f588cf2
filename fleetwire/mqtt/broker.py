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


class BrokerSettings(BaseModel):
    """The MQTT broker of the fleet and this process's login there (``MODELFLEET_BROKER__*``)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    host: str = Field("127.0.0.1", min_length=1)
    """Broker host name or address."""
    port: int = Field(1883, ge=1, le=65535)
    """Broker port (usually 1883, or 8883 for its TLS listener)."""
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
        return self

    def effective_keepalive_s(self, default: int) -> int:
        """The keep-alive sent in CONNECT: ``keepalive_s``, else the deployable's ``default``."""
        return self.keepalive_s if self.keepalive_s is not None else default

    def effective_client_id(self, default: str) -> str:
        """The MQTT client id: the user name when there is one (what a broker with
        ``use_username_as_clientid`` makes of it anyway), else ``client_id``, else ``default``."""
        return self.username or self.client_id or default

    @property
    def url(self) -> str:
        """``mqtt(s)://host:port``, for logs."""
        return f"{'mqtts' if self.tls.enabled else 'mqtt'}://{self.host}:{self.port}"
