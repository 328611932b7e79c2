"""Communication libraries: which algorithm and protocol each runs for a collective (see base.py)."""

from __future__ import annotations

from arcsim.collectives.libraries.base import BARE, Choice, Library, Protocol
from arcsim.collectives.libraries.gloo import Gloo
from arcsim.collectives.libraries.ideal import Ideal
from arcsim.collectives.libraries.mpi import Mpi
from arcsim.collectives.libraries.nccl import Nccl
from arcsim.errors import CollectiveError

__all__ = ["BARE", "LIBRARIES", "Choice", "Library", "Protocol", "get_library", "unknown_library"]

LIBRARIES: dict[str, Library] = {lib.name: lib for lib in (Nccl(), Gloo(), Mpi(), Ideal())}


def unknown_library(name: str, role: str = "") -> str:
    """The one refusal of a library name (``role``, e.g. " for --library", says where it was given)."""
    return f"unknown library {name!r}{role}; choose one of {', '.join(LIBRARIES)}"


def get_library(name: str, role: str = "") -> Library:
    try:
        return LIBRARIES[name.lower()]
    except KeyError:
        raise CollectiveError(unknown_library(name, role)) from None
