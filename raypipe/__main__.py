"""``python -m raypipe COMMAND``: the same as the ``raypipe`` command."""

from raypipe.cli import main

main()
