"""`python -m edgeflow.cli` is the `edgeflow` command."""
import sys

from . import main

sys.exit(main())
