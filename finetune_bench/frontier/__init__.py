"""The memory-frontier capability: per arm, the largest batch size and sequence length that train,
found by probing short runs in child processes, then throughput at those frontiers, and its report."""
