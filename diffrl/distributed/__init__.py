"""Scale-out: Ray actors for rollout engines, reward workers and FSDP2 trainer ranks."""
