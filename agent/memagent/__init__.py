"""memagent: watch the memory of many processes on one box from outside, exactly.

The daemon reads /proc for each watched process every tick, keeps exact peaks and a
bounded history, and streams msgpack frames (see :mod:`memproto`) over a Unix socket.
"""

__version__ = "0.1.0"
SOFTWARE = f"memagent {__version__}"
