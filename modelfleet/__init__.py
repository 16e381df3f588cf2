"""modelfleet: the command line that starts central and edges."""

__version__ = "0.1.0"
