"""The checks of the ``[metrics]`` section's addresses: the Prometheus endpoint's
``ADDR:PORT`` and the node_exporter textfile's path (docs/metrics.md).

:func:`split_listen` is also what the endpoint binds with (memagent.serve's exporter),
so the check and the bind agree on every address. The section's keys are declared with
the others in :mod:`memagent.config.sections`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    import ipaddress

#: ``per_process`` values: one series set per PID, or one per label (sums).
PER_PROCESS = ("pid", "label")



def split_listen(text: str) -> tuple[str, int]:
    """``127.0.0.1:9478``, ``[::1]:9478`` or ``localhost:9478`` as (host, port); an IP
    address must be a literal (no name is resolved: the check and the bind agree), port
    0 (any free one, logged) to 65535. ValueError says what is wrong."""
    import ipaddress  # here: only a configured endpoint has an address (issue 26: a run's start-up)

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
    import ipaddress

    try:
        return ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"not an IP address: {host!r} in {text!r} (an IP address, or localhost)") from None


def listen(v: object, key: str) -> str:
    """string, ``ADDR:PORT``: an IPv4 address, an IPv6 address in brackets or ``localhost``, and a port 0 – 65535"""
    if not isinstance(v, str):
        raise ConfigError(key, f"expected a string such as \"127.0.0.1:9478\", got {v!r}"[:120])
    try:
        split_listen(v)
    except ValueError as exc:
        raise ConfigError(key, str(exc)[:160]) from None
    return v


def file_path(v: object, key: str) -> str:
    """string: an absolute file path"""
    if not isinstance(v, str) or not v.startswith("/") or "\0" in v or v.endswith("/"):
        raise ConfigError(key, f"expected the full path of a file, got {v!r}"[:160])
    return v
