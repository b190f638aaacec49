"""Wire contract shared by agent and coordinator: models, subjects, ids. No I/O here."""
