"""pipelines — applications built on the runtime: the driver-monitoring (DMS) service and its CLI."""
