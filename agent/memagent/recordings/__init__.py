"""Reading a recording: its frames folded into a timeline, its plots, its analysis, and the
writer of ``memagent record``. No command-line code: the commands in :mod:`memagent.cli` call this."""
