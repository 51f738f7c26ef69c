"""GraphPipe's stage DP over the series-parallel tree (Algorithm 1, lines 13-48), one module per
thing it computes: the tree flattened into segments (:mod:`.tree`), their boundary transfers
(:mod:`.segment_comm`), the per-segment tables of one micro-batch size (:mod:`.stage_tables`), the
shared-sink stages' tables (:mod:`.shared_sinks`), the numeric kernel (:mod:`.kernel`), the
traceback to stages (:mod:`.traceback`), the records and value encoding (:mod:`.stage`), the DP
itself with its passes per target (:class:`.stage_dp.StageDP`), what a plan would need where none
fits (:mod:`.needs`), and the DP with per-stage micro-batch sizes and ``k`` (:mod:`.general`)."""
