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
    """Where the kept results are, how many, their size, and partial files that killed writes left."""
    from arcsim import files as kept

    kept.check_cache_folder()
    files, partials = kept.cache_entries(), kept.cache_partials()
    size = sum(p.stat().st_size for p in files)
    left = sum(p.stat().st_size for p in partials)
    write_json({"directory": str(kept.cache_dir()), "results": str(kept.results_dir()), "entries": len(files),
                "bytes": size, "cap_bytes": kept.CACHE_CAP_BYTES, "partial_files": len(partials),
                "partial_bytes": left}, json_out)
    if json_out is None:
        click.echo(f"{kept.results_dir()}: {len(files)} results, {format_size(size)} "
                   f"(cap {format_size(kept.CACHE_CAP_BYTES)}, least recently used dropped first)"
                   + (f"; {len(partials)} partial files of killed writes, {format_size(left)}" if partials else ""))


@cache_group.command("clear")
def cache_clear() -> None:
    """Remove arcsim's kept results and what killed writes left (the next run measures again); nothing else in
    the cache folder is touched."""
    from arcsim import files as kept

    removed, size = kept.cache_clear()
    folders = sorted({str(p.parent) for p in removed}) or [str(kept.results_dir())]
    note(f"removed {len(removed)} files of arcsim's ({format_size(size)}) from {', '.join(folders)}")
