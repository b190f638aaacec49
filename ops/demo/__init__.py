"""`gpufleet demo`: nats-server, a coordinator and simulated agents on one machine
(`run`), its use and fault scenes (`use`), its capacity table (`table`), its flags
(`command`)."""
