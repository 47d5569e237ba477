"""Alerting: would the peaks fit (headroom maths, pure), the alert state machine, the
engine that evaluates every kind each tick, and the hook command that delivers alerts.
"""
