"""Sizes, durations and counts as people read them: one place for every message, table and
log."""

from __future__ import annotations


def human_bytes(count: float | None) -> str:
    """'512 B', '3.0 MiB', 'unlimited' for None (a limit that is not set)."""
    if count is None:
        return "unlimited"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"  # pragma: no cover (the loop always returns)


def human_seconds(seconds: float | None) -> str:
    """'12.34 µs', '1.234 ms', '2.500 s'; '-' for None (not measured)."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"


def plural(count: int, word: str, words: str | None = None) -> str:
    """'1 key', '3 keys'; ``words`` for an irregular plural ('entry', 'entries')."""
    return f"{count} {word}" if count == 1 else f"{count} {words or word + 's'}"
