"""The ``memagent`` command line: parser and commands (:mod:`.main`), the blocking client
(:mod:`.client`), text rendering (:mod:`.render`) and the printing demo (:mod:`.demo`).
"""
