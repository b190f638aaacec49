"""Slurm: `gpufleet slurm conf` (`conf` renders gres.conf, node lines and topology.conf;
`command` is the `slurm` group) and the bridge that keeps Slurm in step (`bridge/`)."""
