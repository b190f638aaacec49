"""`gpufleet slurm conf --pool P [--pool Q …]`: the pools' gres.conf, slurm.conf node lines and
topology.conf, rendered by `ops.slurm.conf` from `nodes.inventories` (operator key)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import click

from ops.kit.options import pass_session
from ops.kit.session import Session
from ops.slurm.bridge.command import bridge_cmd
from ops.slurm.conf import Options, SlurmConf, SlurmConfError, nodes_from_api, render_pools

FILES = {"gres": "gres.conf", "nodes": "gpufleet-nodes.conf", "topology": "topology.conf"}
PAGE = 500


@click.group("slurm")
def slurm_group() -> None:
    """Slurm: describe gpufleet's pools to it, and keep it in step (`bridge`)."""


# `gpufleet slurm bridge` is `gpufleet-slurm-bridge`, as `gpufleet alerts forward` is
# `gpufleet-alerts forward`.
slurm_group.add_command(bridge_cmd, "bridge")


@slurm_group.command("conf")
@click.option(
    "-p", "--pool", "pools", required=True, multiple=True, metavar="POOL",
    help="a pool (its name or id); repeat for a cluster running several",
)  # fmt: skip
@click.option("--only", type=click.Choice(sorted(FILES)), help="print just this file")
@click.option(
    "--out", "out_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
    help=f"write {', '.join(FILES.values())} here (each replaced whole) instead of printing",
)  # fmt: skip
@click.option(
    "--topology-key", default="rack", show_default=True, metavar="LABEL",
    help="the node label whose values are topology.conf's leaf switches (rack, switch, …)",
)  # fmt: skip
@click.option(
    "--threads-per-core", type=click.IntRange(1, 8), default=1, show_default=True,
    help="SMT threads per core on the pool's hosts (for Cores= and ThreadsPerCore=)",
)  # fmt: skip
@click.option(
    "--socket-per-gpu", is_flag=True,
    help="give each GPU a Slurm socket of its own cores (Sockets= the GPU count, disjoint "
    "Cores=): core-bound reservations then hold single GPUs on Slurm before 23.11",
)  # fmt: skip
@click.option(
    "--dev-dir", default="/dev", show_default=True, metavar="DIR",
    help="where the hosts' nvidia device files are",
)  # fmt: skip
@pass_session
def conf_cmd(
    session: Session, pools: tuple[str, ...], only: str | None, out_dir: Path | None,
    topology_key: str, threads_per_core: int, socket_per_gpu: bool, dev_dir: str,
) -> None:  # fmt: skip
    """Generate gres.conf (a line per GPU and MIG instance: type, file, cores, NVLinks),
    the NodeName lines for slurm.conf (CPUs, RealMemory, Gres, Features: pool, model,
    NVLink clique) and topology.conf (leaf switches by a node label) from the ledger's
    inventories of one pool or several (`--pool` repeated: one set of files, one
    topology root), as an operator. Printed, or written with --out."""
    fetched: list[tuple[str, list[dict[str, Any]]]] = []
    for pool in dict.fromkeys(pools):  # each once, in the order given
        pool_id = session.pool_id(None, pool)
        assert pool_id is not None
        fetched.append(_inventories(session, pool_id))
    opts = Options(
        dev_dir=dev_dir, topology_key=topology_key, threads_per_core=threads_per_core,
        socket_per_gpu=socket_per_gpu,
    )  # fmt: skip
    try:
        conf = render_pools([(name, nodes_from_api(items)) for name, items in fetched], opts)
    except SlurmConfError as exc:
        raise click.UsageError(str(exc)) from None
    items = [i for _, got in fetched for i in got]
    name = ", ".join(n for n, _ in fetched)
    texts = _texts(conf)
    chosen = [only] if only else list(FILES)
    if out_dir is None:
        for part in chosen:
            if not only:
                click.echo(f"# ---- {FILES[part]}")
            click.echo(texts[part], nl=False)
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    for part in chosen:
        _replace(out_dir / FILES[part], texts[part])
    session.say(
        f"wrote {', '.join(FILES[p] for p in chosen)} to {out_dir} ({len(items)} nodes of {name})"
    )


def _texts(conf: SlurmConf) -> dict[str, str]:
    return {"gres": conf.gres, "nodes": conf.nodes, "topology": conf.topology}


def _inventories(session: Session, pool_id: str) -> tuple[str, list[dict[str, Any]]]:
    pages = list(session.pages("nodes.inventories", {"poolId": pool_id, "limit": PAGE}))
    return str(pages[-1]["poolName"]), [n for page in pages for n in page["nodes"]]


def _replace(path: Path, text: str) -> None:
    """Write a whole file or nothing: slurmd may read it at any moment."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
