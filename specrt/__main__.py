"""`python -m specrt`: the same command line as `specrt`."""

from .cli import main

main()
