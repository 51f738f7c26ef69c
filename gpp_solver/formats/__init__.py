"""Graph, cluster and plan JSON (``gpp-graph/1``, ``gpp-cluster/1``, ``gpp-plan/1``) and the importers."""
