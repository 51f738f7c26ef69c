"""Load OR-Tools before PuLP in this process.

PuLP imports ``highspy`` when it is imported, and highspy's ``libhighs.so.1`` (another HiGHS
version under the same soname as OR-Tools' own) then stops OR-Tools from loading: CP-SAT, the
schedule model, would be gone for the rest of the process.  Every module of this package that
imports PuLP imports this first; HiGHS itself runs in :mod:`gpp_solver._backend.highs_worker`'s process.
"""

try:  # OR-Tools is a dependency; without it there is nothing to protect
    from ortools.sat.python import cp_model  # noqa: F401
except ImportError:  # pragma: no cover
    pass
