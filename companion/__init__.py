"""Companion library to *When Is a Draft Accepted? A Theory of Acceptance in Speculative Decoding*."""
__version__ = "0.1.0"
