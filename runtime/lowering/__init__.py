"""Plan lowering: a ``gpp-plan/1`` read and checked against the traced model (``plan_io``,
``plan_check``), the model cut into one program per stage (``fx_split``), each stage's orders
lowered to per-rank actions proved deadlock-free (``actions``) and the posting of their
point-to-point messages (``posting``)."""
