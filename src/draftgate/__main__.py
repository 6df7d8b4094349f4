"""`python -m draftgate ...`: the `draftgate` command without its console script."""

from draftgate.cli.main import entry

entry()
