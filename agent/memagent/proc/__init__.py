"""The kernel and driver layer: everything that reads /proc, /sys, /dev/kmsg, NVML or runs
py-spy lives here, and only here. Above it, code gets parsed values and the agent's named
errors (:mod:`memagent.errors`), never raw bytes, errno or a parser's ``ValueError``.
"""
