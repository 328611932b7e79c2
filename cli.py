"""Run arcsim from a checkout: `python cli.py …`."""
from arcsim.cli import main

main()
