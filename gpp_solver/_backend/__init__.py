"""Private backends: the HiGHS worker process, the OR-Tools-before-PuLP load order, progress bars,
and the trampoline that runs deep recursions on an explicit stack."""
