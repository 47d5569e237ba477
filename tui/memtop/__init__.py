"""memtop: a Textual TUI showing the peak memory offenders among watched processes."""
