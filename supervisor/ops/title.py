"""The process title (what ps and top show), for the parent and its children alike."""

from __future__ import annotations


def set_title(text: str) -> None:
    """Show `text` as this process's title; never raises (a title is cosmetic)."""
    try:
        import setproctitle

        setproctitle.setproctitle(text)
    except Exception:  # a title is cosmetic; never let it stop a job
        pass
