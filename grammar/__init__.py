"""The spec grammar, shipped as package data (loaded by symattn.parse)."""
