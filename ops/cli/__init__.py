"""The `gpufleet` commands that read and write through the API: the views and their
tables (`views`, `top`, `answers`), `gpufleet api` generated from the committed OpenAPI
document (`api_spec`, `flags`, `api_commands`), `alerts watch` (`alert_feed`) and the
CLI's settings model (`settings`)."""
