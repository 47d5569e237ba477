"""Installing the daemon as a systemd service: the files, the group, systemd. No command-line
code: ``memagent install-service`` (:mod:`memagent.cli.install_cmd`) calls this."""

#: The shells ``memagent completion`` writes a script for: here, so that the parser names
#: them without importing :mod:`.shellfiles`.
SHELLS = ("bash", "zsh")
