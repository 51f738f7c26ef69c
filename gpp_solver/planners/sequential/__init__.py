"""Sequential-pipeline baselines: PipeDream, PipeDream-2BW and Alpa's stage DP."""
