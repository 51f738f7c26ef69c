"""The design card's name for GraphPipe's search over the target time-per-sample (Algorithm 1): the
code is :mod:`gpp_solver.planners.graphpipe.binary_search`, whose public names are re-exported here."""

from gpp_solver.planners.graphpipe.binary_search import *  # noqa: F403
from gpp_solver.planners.graphpipe.binary_search import __all__  # noqa: F401
