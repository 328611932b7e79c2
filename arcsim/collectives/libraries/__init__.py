"""Communication libraries: which algorithm and protocol each runs for a collective (see base.py)."""

from __future__ import annotations

from arcsim.catalog import unknown_library
from arcsim.collectives.libraries.base import BARE, Choice, Library, Protocol
from arcsim.collectives.libraries.gloo import Gloo
from arcsim.collectives.libraries.ideal import Ideal
from arcsim.collectives.libraries.mpi import Mpi
from arcsim.collectives.libraries.nccl import Nccl
from arcsim.errors import CollectiveError

__all__ = ["BARE", "LIBRARIES", "Choice", "Library", "Protocol", "get_library"]

LIBRARIES: dict[str, Library] = {lib.name: lib for lib in (Nccl(), Gloo(), Mpi(), Ideal())}


def get_library(name: str, role: str = "") -> Library:
    try:
        return LIBRARIES[name.lower()]
    except KeyError:
        raise CollectiveError(unknown_library(name, role)) from None
