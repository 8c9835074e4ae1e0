"""Transports: how snapver reaches a node (a local folder, or SSH)."""
