"""`python -m edgeflow` is the `edgeflow` command."""
import sys

from .cli import main

sys.exit(main())
