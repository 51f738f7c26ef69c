import sys

from gpp_solver.cli import main

sys.exit(main())
