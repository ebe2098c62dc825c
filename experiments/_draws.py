"""The ``--num-draws`` setting of the calibration scripts, and the draws a result row averages."""
from __future__ import annotations

from alacarte.factory import check_draws


def draws_setting(text: str) -> int | str:
    """``--num-draws``'s argparse type: ``auto`` or a positive integer."""
    return check_draws(text if text == "auto" else int(text), "--num-draws")


def row_draws(row: dict) -> int:
    """The fits a result row averages: its ``num_draws``, 1 for rows written before that column."""
    return int(row.get("num_draws") or 1)
