"""Metrics for Prometheus (docs/metrics.md): the snapshot of the daemon's figures, its
exposition in the text formats, and the HTTP endpoint and textfile that carry it out.
"""
