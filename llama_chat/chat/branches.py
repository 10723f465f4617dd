"""The conversation as a tree: where /retry and /edit fork it, the earlier versions stay.

The conversation is the list of exchanges of the version being followed. An exchange
where it forks holds the other versions from there on (`Exchange.others`, each a list of
exchanges that may fork again) and its own place among them, so that every version keeps
its number while another is followed. Versions are numbered across the forks of the
conversation followed, in order: that is what /branches lists and switches to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llama_chat.chat.exchange import Exchange
from llama_chat.errors import LlamaChatError


@dataclass
class Version:
    """One version at a fork of the conversation followed."""

    number: int  # from 1, across every fork, as /branches lists them
    position: int  # the fork's exchange, from 0
    place: int  # the version's place among those at its fork, from 0
    exchanges: list[Exchange]  # the version from the fork on
    current: bool


def versions_at(tail: Sequence[Exchange]) -> list[list[Exchange]]:
    """Every version from tail[0]'s place on, in their order, `tail` among them."""
    first = tail[0]
    return [*first.others[: first.version], list(tail), *first.others[first.version:]]


def fork(replaced: Sequence[Exchange], new: Exchange) -> None:
    """Make `new` the last version in the place of replaced[0], the replaced exchanges and
    their own other versions kept beside it."""
    earlier = versions_at(replaced)
    replaced[0].others, replaced[0].version = [], 0
    new.others, new.version = earlier, len(earlier)


def versions(exchanges: Sequence[Exchange]) -> list[Version]:
    """The versions at each fork of the conversation, numbered."""
    listed = []
    for position, exchange in enumerate(exchanges):
        if exchange.others:
            for place, version in enumerate(versions_at(exchanges[position:])):
                listed.append(Version(len(listed) + 1, position, place, version, place == exchange.version))
    return listed


def switched(exchanges: list[Exchange], number: int) -> list[Exchange]:
    """The conversation following version `number` (as `versions` numbers them)."""
    listed = versions(exchanges)
    if not 1 <= number <= len(listed):
        where = f"from 1 to {len(listed)}" if listed else "none: /retry and /edit make them"
        raise LlamaChatError(f"there is no version {number}: the versions are {where}")
    chosen = listed[number - 1]
    position, place = chosen.position, chosen.place
    everything = versions_at(exchanges[position:])
    exchanges[position].others, exchanges[position].version = [], 0
    chosen.exchanges[0].others = everything[:place] + everything[place + 1:]
    chosen.exchanges[0].version = place
    return exchanges[:position] + chosen.exchanges

