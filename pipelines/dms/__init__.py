"""The driver-monitoring (DMS) service: cabin camera -> warp -> model -> decode -> publish.

Implements openpilot's DMS chain (``dmonitoringmodeld``) on the runtime core, under per-frame
deadlines, with an honest availability state. Modules: ``camera`` (frames, NV12 layout, sources),
``warp`` (the model's input image), ``model`` (the model contract, runners), ``decode`` (outputs to
driverStateV2 fields).
"""
