"""`python -m specdec ...`: the same entry point as the `specdec` command."""
import sys

from .cli import main

sys.exit(main())
