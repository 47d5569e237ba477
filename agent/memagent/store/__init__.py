"""What the daemon keeps on disk: its state directory (kept across restarts), the flight
recorder and its segment files, and the small file helpers the other rooms call. Besides
``memagent.proc``, the one room of the agent that opens files (tests/test_architecture.py).
"""
