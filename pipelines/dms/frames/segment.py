"""An openpilot route segment as a camera: the driver camera's ``dcamera.hevc``, timed by the
segment's log.

:class:`SegmentCamera` decodes the video with PyAV (FFmpeg's HEVC decoder) on the source's
worker thread, converts each frame to NV12 in camerad's layout (the stride and padding of
:func:`~pipelines.dms.frames.frame.nv12_layout`, for the 1928x1208 and the 1344x760 camera alike; the
decoded bytes as they are, no colour conversion) and gives it the frame id and timestamps the log
has for it (:mod:`..openpilot.segment_log` says how the log's Events are matched to the video). Frames are
delivered as :class:`~pipelines.dms.frames.replay.ReplayCamera` delivers a recording's: the log's
timestamps kept as ``recorded_sof`` / ``recorded_eof``, the service's clock in
``timestamp_sof`` / ``timestamp_eof`` (:class:`~pipelines.dms.frames.source.RecordedTime`) —
paced at the log's own frame intervals, or unpaced for a replay.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from aio_runtime import CameraTimeout, get_logger

from ..openpilot.segment_log import (
    VIDEO_NAME,
    SegmentError,
    SegmentFiles,
    SegmentIndex,
    read_segment_index,
    segment_files,
)
from .frame import Frame, FrameGeometryError, nv12_layout
from .recorded import RecordedSource
from .video import Buffer, nv12_from_video
from .video import ffmpeg_said as _said

if TYPE_CHECKING:
    import av

    VideoPacket = av.Packet[av.VideoStream]

__all__ = ["KEYFRAME_HORIZON", "SegmentCamera", "count_video_frames"]

KEYFRAME_HORIZON = 100
"""Frames a segment that fell behind looks ahead for a keyframe to skip to (5 s at 20 Hz; about
6 MB of packets at 10 Mbit/s, kept to be decoded where there is none)."""

_log = get_logger(__name__)


def count_video_frames(path: Path, where: str) -> int:
    """The frames of the raw HEVC stream at ``path``, counted by parsing it (not decoding);
    :class:`SegmentError` for a file that is not one."""
    import av

    try:
        with av.open(str(path), format="hevc") as container:
            stream = container.streams.video[0]
            return sum(1 for packet in container.demux(stream) if packet.size)
    except (av.error.FFmpegError, IndexError) as exc:
        raise SegmentError(f"{where}: {VIDEO_NAME} is not an HEVC stream: {_said(exc)}") from None


class _Video:
    """The video's decoder, used on the camera's worker thread only: frames in display order."""

    def __init__(self, path: Path, where: str, threads: int) -> None:
        import av

        self.where = where
        self.position = 0
        """The next frame's index in the video."""
        try:
            self._container = av.open(str(path), format="hevc")
        except av.error.FFmpegError as exc:
            raise SegmentError(
                f"{where}: {VIDEO_NAME} is not an HEVC stream: {_said(exc)}"
            ) from None
        if not self._container.streams.video:
            self._container.close()
            raise SegmentError(f"{where}: {VIDEO_NAME} holds no video stream")
        stream = self._container.streams.video[0]
        context = stream.codec_context
        # A damaged frame is an error, not a frame FFmpeg conceals and passes on as good.
        context.options = {"err_detect": "explode"}
        context.thread_count = threads
        width, height = context.width, context.height
        if width <= 0 or height <= 0 or width % 2 or height % 2:
            self._container.close()
            raise SegmentError(
                f"{where}: {VIDEO_NAME} is {width}x{height}; NV12 needs positive, even dimensions"
            )
        self._stream = stream
        self._packets: Iterator[VideoPacket] = self._container.demux(stream)
        self._held: deque[VideoPacket] = deque()
        """Packets read and not decoded yet (where looking for a keyframe stopped)."""
        self._decoded: deque[av.VideoFrame] = deque()
        self._flushed = False

    def read(self) -> tuple[Buffer, int, int] | None:
        """The next frame (NV12, width, height), or None at the end of the video."""
        import av

        try:
            decoded = self._next_decoded()
        except av.error.FFmpegError as exc:
            raise SegmentError(
                f"{self.where}: video frame {self.position} of {VIDEO_NAME} cannot be decoded: "
                f"{_said(exc)}"
            ) from None
        if decoded is None:
            return None
        self.position += 1
        try:
            return nv12_from_video(decoded)
        except FrameGeometryError as exc:
            raise SegmentError(f"{self.where}: video frame {self.position - 1}: {exc}") from None

    def _next_packet(self) -> VideoPacket | None:
        return self._held.popleft() if self._held else next(self._packets, None)

    def _next_decoded(self) -> av.VideoFrame | None:
        """Packet by packet (each a frame: no B-frames, so decode order is display order)."""
        while not self._decoded:
            packet = None if self._flushed else self._next_packet()
            if packet is None:
                return None
            self._flushed = not packet.size  # the last, empty packet flushes the decoder
            self._decoded.extend(self._stream.decode(packet))
        return self._decoded.popleft()

    def skip_to_keyframe(self, position: int) -> int:
        """Skip, without decoding them, the frames before the first keyframe at or after video
        frame ``position``, where there is one within :data:`KEYFRAME_HORIZON` frames (else
        none: the packets looked at are kept, to be decoded): how many frames it skipped."""
        looked: list[VideoPacket] = []
        at = self.position + len(self._decoded)  # the next packet's frame
        for packet in iter(self._next_packet, None):
            looked.append(packet)
            if not packet.size or len(looked) > KEYFRAME_HORIZON:
                break  # the end, or too far to look
            if packet.is_keyframe and at >= position:
                skipped = len(self._decoded) + len(looked) - 1
                self._decoded.clear()
                self._held.extendleft(reversed(looked[-1:]))  # decoding starts again here
                self._stream.codec_context.flush_buffers()  # what it held of the frames skipped
                self.position += skipped
                return skipped
            at += 1
        self._held.extendleft(reversed(looked))  # nothing to skip to: decoded as they come
        return 0

    def close(self) -> None:
        self._container.close()


class SegmentCamera(RecordedSource):
    """The driver camera of the openpilot route segment in ``path``, as a camera (see the module
    docstring): one frame per video frame the log times, with the log's frame ids.

    * ``paced`` — delivered at the log's own frame intervals (``aio-dms run``); unpaced: as fast
      as they are asked for, each stamped as it is decoded (``aio-dms replay``).
    * ``open_timeout`` — bound on opening: reading and matching the log, parsing the video to
      count its frames; ``decode_timeout`` — bound on decoding one frame. Both run on the
      camera's worker thread (:class:`~aio_runtime.CameraTimeout` past them), never on the loop.
    * ``decode_threads`` — FFmpeg's decoding threads (0: as many as it likes).

    Opening (:meth:`open`, or the first frame request) raises :class:`SegmentError` for a path
    that is not a segment, a log without camera states, a video shorter than its encode index
    says, or a video that is not HEVC, and :class:`~..openpilot.logs.LogError` for a log that cannot be
    read. A frame that cannot be decoded raises :class:`SegmentError` when it is reached. Video
    frames the log does not time, and (without an encode index) camera states beyond the video,
    are skipped: logged once, as the segment opens, and counted in :attr:`index`.
    """

    _reading = "decoding"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        paced: bool = True,
        open_timeout: float = 30.0,
        decode_timeout: float = 2.0,
        decode_threads: int = 1,
    ) -> None:
        super().__init__(paced=paced)
        self.path = Path(path)
        """The segment directory."""
        self.open_timeout = open_timeout
        self.decode_timeout = decode_timeout
        self.read_timeout = decode_timeout
        self.decode_threads = decode_threads
        self.files: SegmentFiles | None = None
        """The segment's video and log, once open."""
        self.index: SegmentIndex | None = None
        """The log's account of the video, once open."""
        self._where = f"route segment {str(self.path)!r}"
        self._video: _Video | None = None
        """The decoder: made, used and closed on the worker thread, one call at a time."""
        self._opened: SegmentIndex | None = None
        """The index, as the worker thread's open found it (before the loop hears of it)."""
        self._last = 0
        """The last video frame the log times: decoding stops there."""

    async def open(self) -> SegmentIndex:
        """Read the log and match it to the video (on the worker thread); done by the first
        frame request if not before."""
        if self.index is None:
            if self._closed:
                raise RuntimeError(f"{self._where} is closed")
            self.index = await self._blocking(
                self._open_blocking, awaited=f"opening {self._where}", timeout=self.open_timeout
            )
            self.length = self.index.matched
            self._last = max(k for k, frame in enumerate(self.index.frames) if frame is not None)
            self._report(self.index)
        return self.index

    def _open_blocking(self) -> SegmentIndex:
        if self._opened is not None:  # by an earlier open that was not waited for to its end
            return self._opened
        files = self.files = segment_files(self.path)
        count = count_video_frames(files.video, self._where)
        if count == 0:
            raise SegmentError(f"{self._where}: {VIDEO_NAME} holds no video frames")
        index = read_segment_index(files.log, count, self._where)
        if index.matched == 0:
            raise SegmentError(f"{self._where}: the log times none of the video's frames")
        self._video = _Video(files.video, self._where, self.decode_threads)
        self._opened = index
        if self._closed:  # closed while this ran (a close that gave up waiting for it)
            self._close_blocking()
        return index

    def _report(self, index: SegmentIndex) -> None:
        if index.beyond_video:
            _log.warning(
                "camera states beyond the video's length: skipped",
                segment=str(self.path),
                camera_states=index.camera_states,
                video_frames=len(index.frames),
                skipped=index.beyond_video,
            )
        if index.untimed:
            _log.warning(
                "video frames the log does not time: skipped",
                segment=str(self.path),
                video_frames=len(index.frames),
                skipped=index.untimed,
            )

    def _skip_recorded(self, recorded_sof: int) -> int:
        """To the first keyframe at or after the frame recorded at ``recorded_sof``: a
        decoder that fell behind catches up there, whatever decoding costs."""
        index, video = self.index or self._opened, self._video
        if index is None or video is None:
            return 0
        target = next(
            (
                k
                for k, logged in enumerate(index.frames)
                if k >= video.position
                and logged is not None
                and logged.timestamp_sof >= recorded_sof
            ),
            len(index.frames),
        )
        start = video.position
        video.skip_to_keyframe(target)
        return sum(logged is not None for logged in index.frames[start : video.position])

    def _read_recorded(self) -> Frame | None:
        index = self.index if self.index is not None else self._opened
        while self._video is not None and index is not None:
            position = self._video.position
            if position > self._last:
                return None
            decoded = self._video.read()
            if self._closed:  # closed while this decoded (a close that gave up waiting for it)
                self._close_blocking()
            if decoded is None:
                return None
            logged = index.frames[position]
            if logged is None:
                continue  # a video frame the log does not time
            buffer, width, height = decoded
            return Frame(
                buffer,
                width,
                height,
                nv12_layout(width, height).stride,
                frame_id=logged.frame_id,
                timestamp_sof=logged.timestamp_sof,
                timestamp_eof=logged.timestamp_eof,
            )
        return None

    async def aclose(self) -> None:
        """Close the video (after any open or decode still running on the worker thread). A
        close that waits longer than the decode bound for that work gives up waiting (logged):
        the work closes the video as it finishes. A close never raises in place of what ended
        the camera (a stop, a decode that failed)."""
        self._closed = True
        try:
            self._withdraw()
            if self._worker is not None:
                await self._blocking(
                    self._close_blocking,
                    awaited=f"closing {self._where}",
                    timeout=self.decode_timeout,
                )
        except CameraTimeout as exc:
            _log.warning("route segment closed before its worker finished", error=str(exc))
        finally:
            self._end_worker()

    def _close_blocking(self) -> None:
        video, self._video = self._video, None
        if video is not None:
            video.close()
