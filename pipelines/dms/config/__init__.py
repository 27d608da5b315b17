"""The shared vocabulary of settings: every setting of the service declared once
(:mod:`.settings`), the kinds of mode, device and camera (:mod:`.kinds`), values' checks and text
forms (:mod:`.values`, :mod:`.text`), the machine's checks (:mod:`.machine`) and the scripted
faults (:mod:`.faults`)."""
