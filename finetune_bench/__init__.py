"""finetune-bench's core: everything that plans, runs, measures and reports a benchmark, without Flyte.

Subpackages in the order data flows (each imports only those before it): `inputs` (what the user asks
for) → `sources` (models and data) → `measuring` (what a step costs) → `results` (a run's record and
the results store) → `running` (a run in a child process; the training backends) and `integrations`
(W&B) → `analysis` (tables, statistics, parity) → `reporting` (the HTML report) → `frontier` (the
memory-frontier capability). `tasks/` and `workflows/` wrap these for Flyte.
"""
