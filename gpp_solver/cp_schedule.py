"""The design card's name for the CP-SAT check and tightening of micro-batch orders: the code is
:mod:`gpp_solver.cp_orders.cp_schedule`, whose public names are re-exported here."""

from gpp_solver.cp_orders.cp_schedule import *  # noqa: F403
from gpp_solver.cp_orders.cp_schedule import __all__  # noqa: F401
