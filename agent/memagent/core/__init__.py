"""The core: the watched process and its peak, the registry of them, the tick that
samples them (memory, GPU), auto-attach, and when to read Python stacks. It gets its
facts from :mod:`memagent.proc` and knows nothing of alerts, sockets or the command line.
"""
