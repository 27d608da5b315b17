"""What the model takes and gives: openpilot's DMS contract (:mod:`.contract`), the model's
metadata (:mod:`.metadata`) read within limits (:mod:`.limits`, :mod:`.safe_pickle`), the bundled
reference model (:mod:`.reference`), the warp to the model's input (:mod:`.warp`) and the decode of
its output (:mod:`.decode`)."""
