"""Checks shared by every learned part's checkpoint loader."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .errors import CheckpointError


def require_backbone(path: os.PathLike, stored: Optional[str], live: Optional[str], how_to_retrain: str = "") -> None:
    """Refuse a checkpoint trained for another backbone, naming the file (no check when ``live`` is None)."""
    if live is not None and stored != live:
        hint = f"; retrain it with `{how_to_retrain}`" if how_to_retrain else ""
        raise CheckpointError(f"{Path(path).name} was trained for backbone {stored!r}, "
                              f"not for the live backbone {live!r}{hint}")
