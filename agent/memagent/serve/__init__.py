"""Serving: the Unix socket, one session per client, who may see what (access), the
requests' dispatch, and the daemon's status as clients read it.
"""
