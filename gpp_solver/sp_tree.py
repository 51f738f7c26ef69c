"""The design card's name for GraphPipe's series-parallel tree: the code is
:mod:`gpp_solver.planners.graphpipe.sp_tree`, whose public names are re-exported here."""

from gpp_solver.planners.graphpipe.sp_tree import *  # noqa: F403
from gpp_solver.planners.graphpipe.sp_tree import __all__  # noqa: F401
