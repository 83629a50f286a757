"""`python -m control.demo`: the sandbox showcase, then the reference demo."""

import sys

from control.demo.cli import run_all

sys.exit(run_all())
