"""Whether the backend is open: the one flag its parts read before they call the engine.

The backend closes once (:meth:`BaseLogprobBackend.close
<genlm_core.engine.backend.BaseLogprobBackend.close>`); every part holding the same
:class:`Lifecycle` refuses work from then on, so no call reaches a released engine.
"""

from __future__ import annotations

__all__ = ["Lifecycle"]


class Lifecycle:
    """The backend's open or closed state, shared by its parts.

    Args:
        name: the backend's name, for messages.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def check_open(self) -> None:
        """Refuse a call on a closed backend (``RuntimeError``)."""
        if self.closed:
            raise RuntimeError(f"{self.name}: the backend is closed")

    def close(self) -> bool:
        """Mark the backend closed; whether it was open (the first close does the work)."""
        was_open = not self.closed
        self.closed = True
        return was_open
