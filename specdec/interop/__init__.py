"""Drafters in the layouts other tools read and write (import and export)."""
