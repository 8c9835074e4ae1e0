"""snapver: version control for the code deployed on GPU nodes."""

__version__ = "0.1.0"
