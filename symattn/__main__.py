"""`python -m symattn` is the `symattn` command."""

from .cli import run

run()
