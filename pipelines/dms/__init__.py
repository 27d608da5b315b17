"""The driver-monitoring (DMS) service: cabin camera -> warp -> model -> decode -> publish.

Implements openpilot's DMS chain (``dmonitoringmodeld``) on the runtime core, under per-frame
deadlines, with an honest availability state. Modules:

- ``camera``, ``camera_sources``, ``camera_video``, ``camera_replay``: frames (NV12), the cabin
  cameras, and the synthetic, video-file and replay sources;
- ``warp``: the model's input image, as openpilot warps it;
- ``model``, ``model_metadata``, ``model_runner``, ``reference_model``: the model contract, the
  bundled reference model, onnxruntime on the CPU;
- ``accelerator``: the model on the simulated accelerator (through ``transports``);
- ``decode``: outputs to the driverStateV2 fields, validated;
- ``messages``, ``publish``: the published message and its sinks;
- ``channels``: latest-frame-wins slots and the frame accounting rule;
- ``endpoints``: health and metrics over HTTP;
- ``faults``: scripted faults; ``service``: the service; ``run``: ``aio-dms run``.
"""
