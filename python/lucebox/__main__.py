"""`python -m lucebox` runs the command line."""
import sys

from lucebox.cli import main

sys.exit(main())
