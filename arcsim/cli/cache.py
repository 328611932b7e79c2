"""`arcsim cache info | clear`: the compressor measurements kept on disk (arcsim.run.cache)."""

from __future__ import annotations

import click

from arcsim.cli.common import json_option, note, write_json
from arcsim.units import format_size


@click.group("cache")
def cache_group() -> None:
    """Compressor measurements kept between runs, so a trace re-priced elsewhere only prices."""


@cache_group.command("info")
@json_option
def cache_info(json_out: str | None) -> None:
    """Where the cache is, how many measurements it holds and their size."""
    from arcsim.run import cache

    files = cache.entries()
    size = sum(p.stat().st_size for p in files)
    write_json({"directory": str(cache.cache_dir()), "measurements": len(files), "bytes": size,
                "cap_bytes": cache.CAP_BYTES}, json_out)
    if json_out is None:
        click.echo(f"{cache.cache_dir()}: {len(files)} measurements, {format_size(size)} "
                   f"(cap {format_size(cache.CAP_BYTES)}, least recently used dropped first)")


@cache_group.command("clear")
def cache_clear() -> None:
    """Remove every cached measurement (the next run measures again)."""
    from arcsim.run import cache

    files, size = cache.clear()
    note(f"removed {files} measurements ({format_size(size)}) from {cache.cache_dir()}")
