"""The version of symattn, in a module of its own so that any stage can name it without
importing the package root (which imports the API, and so every stage)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
