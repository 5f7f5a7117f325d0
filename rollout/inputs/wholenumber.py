"""Whole numbers in text rollout did not write: node labels, command output, plan fields,
inventories, known_hosts entries.

ASCII digits only. str.isdigit() also accepts digit signs such as '²' that int() then
refuses, and int() on its own accepts signs, spaces and underscores; a check of one and a
conversion by the other read hostile input as a crash or as a number it does not spell.
"""


def whole_number(text: str) -> int | None:
    """The number `text` spells in ASCII digits; None when it is anything else or empty."""
    return int(text) if text.isascii() and text.isdigit() else None
