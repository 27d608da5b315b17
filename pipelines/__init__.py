"""pipelines — applications built on the runtime: the driver-monitoring (DMS) service and its CLI."""


def __getattr__(name: str) -> str:
    if name == "__version__":  # looked up on first use: importing pipelines.dms stays light
        from aio_runtime import __version__

        return __version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
