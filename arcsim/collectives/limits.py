"""How much work a pricing may take before it asks for permission: estimated up front, never discovered.

The closed form stores every distinct step's messages (32 B each); the DES processes about
``EVENTS_PER_MESSAGE`` SimPy events per simulated message. Past a limit the request is refused with one
line that names the estimate and the way on (``--force``, fewer ranks, another algorithm); below it but
past ``PROGRESS_EVENTS`` the DES reports its progress. ``allow_any()`` lifts the limits (``--force``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from arcsim.errors import CollectiveError

STORED_MESSAGES = 50_000_000      # closed form: about 1.6 GB of step arrays
DES_EVENTS = 20_000_000           # DES: about seven minutes at ~50,000 events/s on one core
PROGRESS_EVENTS = 1_000_000       # DES runs estimated above this show progress
EVENTS_PER_MESSAGE = 2.4          # measured: 2.38 and 2.39 (NCCL's tree over 8 NICs, 1,024 and 10,240 ranks)
EVENTS_PER_SECOND = 50_000        # measured on a 2-core CPU, slower as runs grow: 61,000/s (1,024-rank tree, 7.0 s),
#                                   53,000/s (10,240 ranks, 83.3 s), 42,000/s (131,072 ranks, 24 M events in 577 s)

_unlimited: ContextVar[bool] = ContextVar("unlimited", default=False)
_stored: ContextVar[list[int] | None] = ContextVar("stored", default=None)


class TooMuchWork(CollectiveError):
    """A pricing whose estimated work is past the limits (lifted by ``--force``)."""


@contextmanager
def allow_any(enabled: bool = True) -> Iterator[None]:
    """Lift the work limits inside the block when ``enabled``."""
    token = _unlimited.set(enabled or _unlimited.get())
    try:
        yield
    finally:
        _unlimited.reset(token)


def lifted() -> bool:
    """Whether the work limits are lifted here (inside :func:`allow_any`)."""
    return _unlimited.get()


@contextmanager
def counting_stored(what: str) -> Iterator[None]:
    """Count the messages the steps built inside the block store; refuse past ``STORED_MESSAGES``."""
    token = _stored.set([0])
    try:
        yield
    except TooMuchWork as exc:
        raise TooMuchWork(f"{what}: {exc}") from None
    finally:
        _stored.reset(token)


def store(messages: int) -> None:
    """Called by every step as it is built: the running count, checked against the limit."""
    counter = _stored.get()
    if counter is None or _unlimited.get():
        return
    counter[0] += messages
    if counter[0] > STORED_MESSAGES:
        _refuse_storing()


def expect_stored(messages: int) -> None:
    """Refuse before building when the steps about to be built will hold ``messages`` past the limit (a
    builder that knows its count up front, so that a refusal costs no work)."""
    counter = _stored.get()
    if counter is not None and not _unlimited.get() and counter[0] + messages > STORED_MESSAGES:
        _refuse_storing()


def _refuse_storing() -> None:
    raise TooMuchWork(f"its steps hold more than {STORED_MESSAGES / 1e6:.0f} M messages "
                      f"(over {STORED_MESSAGES * 32 / 1e9:.1f} GB); use fewer ranks or another algorithm "
                      "(ring and hierarchical stay small), or --force to build it anyway")


def des_events(simulated_messages: float) -> float:
    return EVENTS_PER_MESSAGE * simulated_messages


def within_des(events: float) -> bool:
    """Whether a DES estimated at ``events`` events is within ``DES_EVENTS``."""
    return events <= DES_EVENTS


def check_des(what: str, events: float) -> None:
    """Refuse a DES estimated past ``DES_EVENTS`` events, unless the limits are lifted."""
    if not within_des(events) and not _unlimited.get():
        raise TooMuchWork(f"{what}: the DES would process about {events / 1e6:,.0f} M events (~"
                          f"{events / EVENTS_PER_SECOND / 60:,.0f} min here); use --engine analytic, fewer ranks, "
                          "or --force to run it anyway")
