"""Result records → answers: the results and per-step tables, each arm against the baseline with paired
statistics, loss parity, what fits and what to run. pandas and scipy only, never torch."""
