"""`arcsim cache info | clear`: the measurements and model workloads kept on disk (arcsim.files)."""

from __future__ import annotations

import click

from arcsim.cli.common import json_option, note, write_json
from arcsim.units import format_size


@click.group("cache")
def cache_group() -> None:
    """Compressor measurements (and model workloads) kept between runs, so a trace re-priced elsewhere only
    prices."""


@cache_group.command("info")
@json_option
def cache_info(json_out: str | None) -> None:
    """Where the cache is, how many results it holds and their size."""
    from arcsim import files as kept

    files = kept.cache_entries()
    size = sum(p.stat().st_size for p in files)
    write_json({"directory": str(kept.cache_dir()), "entries": len(files), "bytes": size,
                "cap_bytes": kept.CACHE_CAP_BYTES}, json_out)
    if json_out is None:
        click.echo(f"{kept.cache_dir()}: {len(files)} results, {format_size(size)} "
                   f"(cap {format_size(kept.CACHE_CAP_BYTES)}, least recently used dropped first)")


@cache_group.command("clear")
def cache_clear() -> None:
    """Remove everything cached (the next run measures again)."""
    from arcsim import files as kept

    files, size = kept.cache_clear()
    note(f"removed {files} cached results ({format_size(size)}) from {kept.cache_dir()}")
