"""The `axlearn` command-line tool (`axlearn config dump ...`); see `axlearn.cli.main`."""
