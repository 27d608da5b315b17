"""What installs the optional parts: the commands that need one name it when it is missing."""

from __future__ import annotations

__all__ = ["DMS_EXTRA", "FLEET_EXTRA"]

DMS_EXTRA = "pip install 'aio-dms[dms]'"
"""What installs the DMS service's dependencies."""
FLEET_EXTRA = "pip install 'aio-dms[fleet]'"
"""What installs pyarrow (Parquet) and Ray (fleet replays)."""
