"""The registered scenarios: importing this package registers each one (one line each, in the
order of issue 13's numbering; the report lists them in this order)."""

from __future__ import annotations

from reliability.scenarios import bit_rot as _bit_rot  # noqa: F401  (2)
from reliability.scenarios import disk_faults as _disk_faults  # noqa: F401  (3)
from reliability.scenarios import exposure as _exposure  # noqa: F401  (7)
from reliability.scenarios import hostile_inputs as _hostile_inputs  # noqa: F401  (4)
from reliability.scenarios import kill_storm as _kill_storm  # noqa: F401  (1)
from reliability.scenarios import live_ops as _live_ops  # noqa: F401  (5)
from reliability.scenarios import soak as _soak  # noqa: F401  (6)
