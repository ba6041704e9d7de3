"""The chapters' assertions, importable from the book's package as before: :mod:`companion.checks`."""
from companion.checks import check_all, check_close, check_identical, check_le

__all__ = ["check_all", "check_close", "check_identical", "check_le"]
