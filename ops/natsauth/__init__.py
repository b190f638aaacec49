"""`gpufleet nats-auth`: the NATS users and their permissions (`users`), the server's
authorization config (`server_config`), and the command that writes both (`command`)."""
