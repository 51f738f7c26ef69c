"""Execution: ``GraphPipeline`` (``pipeline``) and what it runs on each rank: the stage set up
before the first message (``stage_setup``), its executor (``executor``), point-to-point messages
(``p2p``), data-parallel gradient sync (``grad_sync``), time and memory records (``metrics``),
the optimizer's state against the plan's (``optimizer_state``), per-stage checkpoints
(``checkpoint``) and the one-process reference run of ``--verify`` (``verify``)."""
