"""Reading a recording: its frames folded into a timeline, its plots, its analysis, and the
writer of ``memagent record``. No command-line code: the commands in :mod:`memagent.cli` call this."""

#: The two sources of ``memagent history`` (its ``--from``, and ``"source"`` in its JSON):
#: here, so that the parser names them without importing the reader.
RAM, RECORDING = "ram", "recording"
