"""`python -m symattn` is the `symattn` command."""

from .cli import main

raise SystemExit(main())
