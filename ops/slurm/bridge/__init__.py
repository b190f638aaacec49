"""The Slurm bridge's parts: `settings` (its one frozen settings model), `ledger_view`
(the coordinator's reservations and nodes as the bridge reads them over HTTP),
`planner` (pure: the Slurm state the ledger asks for, and the actions that take Slurm
there without touching anything gpufleet does not own), `scontrol` (the adapter that
reads Slurm's state and runs the actions), `metrics` (its Prometheus text endpoint) and
`command` (its command line). `ops.slurm.bridge.daemon` wires them."""
