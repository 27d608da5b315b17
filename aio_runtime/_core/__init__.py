"""The core's implementation, one concern per module; :mod:`aio_runtime` re-exports its public part.

Names without an underscore that a module here does not list in its ``__all__`` are shared between
these modules only (package-internal): nothing outside :mod:`aio_runtime` uses them.
"""
