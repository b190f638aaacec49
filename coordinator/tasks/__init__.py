"""Background work of the coordinator: named loops only. Their bodies are services'
methods (node state writes, last-seen flush, unreachable sweep) and the rollup rebuild."""
