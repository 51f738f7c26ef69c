"""Private backends: the HiGHS worker process, the OR-Tools-before-PuLP load order, progress bars."""
