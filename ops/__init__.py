"""Operator tooling, one folder per tool: `cli/` (the `gpufleet` commands), `demo/`,
`natsauth/` (`gpufleet nats-auth`), `forwarder/` (the alert forwarder) and `slurm/`
(`slurm conf` and the Slurm bridge), plus `kit/`, what several of them share (the API
client, the CLI session and output, the alert source, the embedded nats-server, keys).
`main.py` mounts the tools on the `gpufleet` group. A tool imports `ops.kit` and
`shared`, never another tool nor the coordinator; nothing here runs inside the
coordinator or the agent: it talks to them over HTTP or NATS, or starts them."""
