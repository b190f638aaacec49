"""The ledger simulation (SPEC §8 "Truth"): simulated hosts whose inventories change,
a reference model of what the ledger must never do, and the randomized drivers — a
hypothesis state machine (tests/integration/coordinator/ledger/test_simulation.py) and
concurrent writers on PostgreSQL — that hold the real ledger and services to it."""
