"""The ``[metrics]`` section: the Prometheus endpoint and the node_exporter textfile
(docs/metrics.md), each off unless configured.

Its own module because the two configuration modules are at their size limit; the checks
here are :mod:`memagent.config_schema`'s kind (a value passes, or one ConfigError names
its key), and :mod:`memagent.config` builds :class:`MetricsConfig` with
:func:`metrics_config`.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

#: ``per_process`` values: one series set per PID, or one per label (sums).
PER_PROCESS = ("pid", "label")


@dataclass
class MetricsConfig:
    #: ``ADDR:PORT`` of the HTTP endpoint; None: no endpoint.
    listen: str | None = None
    #: The file written for node_exporter's textfile collector; None: none.
    textfile: str | None = None
    textfile_interval: float = 15.0
    #: Seconds an exited process stays in the exposition.
    exited_ttl: float = 300.0
    per_process: str = "pid"


def split_listen(text: str) -> tuple[str, int]:
    """``127.0.0.1:9478``, ``[::1]:9478`` or ``localhost:9478`` as (host, port); an IP
    address must be a literal (no name is resolved: the check and the bind agree), port
    0 (any free one, logged) to 65535. ValueError says what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"not ADDR:PORT: {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not isinstance(_address(host, text), ipaddress.IPv6Address):
            raise ValueError(f"not an IPv6 address in brackets: {text!r}")
    elif host != "localhost" and not isinstance(_address(host, text), ipaddress.IPv4Address):
        raise ValueError(f"an IPv6 address goes in brackets: {text!r} (e.g. [::1]:9478)")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"not a port: {port!r} in {text!r} (0 to 65535)")
    return host, int(port)


def _address(host: str, text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"not an IP address: {host!r} in {text!r} (an IP address, or localhost)") from None


def _listen(v: object, key: str) -> str:
    if not isinstance(v, str):
        raise ConfigError(key, f"expected a string such as \"127.0.0.1:9478\", got {v!r}"[:120])
    try:
        split_listen(v)
    except ValueError as exc:
        raise ConfigError(key, str(exc)[:160]) from None
    return v


def _textfile(v: object, key: str) -> str:
    if not isinstance(v, str) or not v.startswith("/") or "\0" in v or v.endswith("/"):
        raise ConfigError(key, f"expected the full path of a file, got {v!r}"[:160])
    return v


def _seconds(lo: float, hi: float) -> Any:
    def check(v: object, key: str) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ConfigError(key, f"expected a number, got {v!r}"[:120])
        if not lo <= v <= hi:
            raise ConfigError(key, f"out of range: {v:g} (from {lo:g} to {hi:g} seconds)")
        return float(v)
    return check


def _per_process(v: object, key: str) -> str:
    if v not in PER_PROCESS:
        raise ConfigError(key, f"expected \"pid\" or \"label\", got {v!r}"[:120])
    return str(v)


#: The section's keys and their checks (:data:`memagent.config_schema.SCHEMA`'s ``metrics``).
METRICS_SCHEMA: dict[str, Any] = {
    "listen": _listen,
    "textfile": _textfile,
    "textfile_interval": _seconds(1.0, 86_400.0),
    "exited_ttl": _seconds(0.0, 86_400.0),
    "per_process": _per_process,
}


def metrics_config(values: dict[str, Any], flags: dict[str, Any]) -> MetricsConfig:
    """From the file's checked ``values`` (``metrics.KEY``) and the daemon's ``--metrics``."""
    config = MetricsConfig(**{k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("metrics.")})
    if flags.get("metrics") is not None:
        config.listen = flags["metrics"]
    return config
