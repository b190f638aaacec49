"""The coordinator: ledger, node states, rollup, capacity and reservation API, alerts."""
