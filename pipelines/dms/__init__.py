"""The driver-monitoring (DMS) service: cabin camera -> warp -> model -> decode -> publish.

Implements openpilot's DMS chain (``dmonitoringmodeld``) on the runtime core, under per-frame
deadlines, with an honest availability state. Modules:

- ``camera``, ``camera_sources``, ``camera_video``, ``camera_replay`` (with ``recording``,
  ``recording_reader``): frames (NV12), the cabin cameras, and the synthetic, video-file and
  replay sources, and recordings;
- ``warp``: the model's input image, as openpilot warps it;
- ``model``, ``model_metadata`` (with ``metadata_limits``, ``metadata_pickle``), ``model_runner``,
  ``reference_model``: the model contract (its metadata read within limits), the bundled reference
  model, onnxruntime on the CPU;
- ``accelerator``: the model on the simulated accelerator (through ``transports``);
- ``decode``: outputs to the driverStateV2 fields, validated;
- ``messages``, ``publish`` (with ``sinks_policy``, ``sinks_memory``, ``sinks_jsonl``,
  ``sinks_zmq``): the published message and its sinks, each with its policy per mode;
- ``channels``: the slots between stages (latest-frame-wins live, hand-off replaying) and the
  frame accounting rule;
- ``endpoints``: health and metrics over HTTP;
- ``config`` (with ``config_kinds``, ``config_values``): every setting, declared once;
- ``faults``: scripted faults; ``service``: the service; ``run`` (with ``run_summary``,
  ``run_progress``): ``aio-dms run`` and ``replay``; ``run_record``: ``aio-dms record``.
"""
