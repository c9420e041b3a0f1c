"""The registered scenarios: importing this package registers each one (one line each, in the
order of issue 13's numbering; the report lists them in this order)."""

from __future__ import annotations

from reliability.scenarios import disk_faults as _disk_faults  # noqa: F401  (3)
from reliability.scenarios import exposure as _exposure  # noqa: F401  (7)
from reliability.scenarios import hostile_inputs as _hostile_inputs  # noqa: F401  (4)
