"""snapver: version control for the code deployed on GPU nodes."""

__version__ = "0.2.0"
