"""CP-SAT over the micro-batch orders of a fixed partition: the model (:mod:`.order_model`, its data
in ticks :mod:`.schedule_data`) and the verify and tighten steps that use it (:mod:`.cp_schedule`,
the design card's ``gpp_solver.cp_schedule``)."""
