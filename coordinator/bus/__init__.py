"""The bus: the only coordinator package that imports nats."""
