"""Frames and where they come from: the frame and its NV12 layout (:mod:`.frame`), the source
protocol and its pacing (:mod:`.source`), and every source: synthetic (:mod:`.synthetic`), a
video file (:mod:`.video`), a recording of ours (:mod:`.recording`, :mod:`.recording_reader`,
replayed by :mod:`.replay`), an openpilot route segment (:mod:`.segment`), and the read-ahead of
recorded input run live (:mod:`.recorded`)."""
