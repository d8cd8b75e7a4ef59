"""The embedded compiler and its kernel library."""
