"""Workflows: one unit of work each, between the API/bus/tasks and the ledger."""
