"""The coordinator's resources, one async context each (ledger, bus, node watch, loops,
HTTP), which `coordinator/app.py` enters in that order on one exit stack: each undoes
on exit what it did on entry, so shutdown undoes startup in reverse order (aiohttp's
cleanup contexts, applied to the whole process)."""
