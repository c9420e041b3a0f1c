"""The registered scenarios: importing this package registers each one (one line each, in the
order of issue 13's numbering; the report lists them by number)."""

from __future__ import annotations
