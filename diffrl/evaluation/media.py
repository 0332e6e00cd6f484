"""Samples to files: a video with its sound as an ``.mp4`` (H.264 + AAC, through PyAV: FFmpeg in
its wheel, nothing to install system-wide), each frame as a PNG beside it; what ``diffrl sample``
writes for video families.

H.264 needs even sides for its 4:2:0 chroma; a video with an odd side is written 4:4:4 instead
(``yuv444p``: fewer players read it). AAC takes the rates of its standard (8 to 96 kHz, see
:data:`AAC_RATES`); sound at another rate is written at 48 kHz, resampled by FFmpeg's swresample.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch
from PIL import Image

from diffrl.core.errors import DiffrlError
from diffrl.core.rollout import Audio, quantize

DEFAULT_FPS = 24.0
"""The frame rate of a video whose family does not say (LTX-2's default)."""
AAC_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)
"""The sampling frequencies AAC defines (ISO/IEC 14496-3, ``sampling_frequency_index``)."""
LAYOUTS = {1: "mono", 2: "stereo"}
CRF = "18"
"""libx264's constant-rate factor: visually lossless for generated video."""


def write_mp4(path: Path, video: torch.Tensor, fps: float | None, audio: Audio | None = None) -> Path:
    """``video (3, F, H, W)`` (uint8, or float in [0, 1]) at ``fps`` and ``audio`` (one clip,
    ``waveform (1, C, S)``, C in 1, 2) -> ``path`` (an .mp4). Returns ``path``."""
    if video.ndim != 4 or video.shape[0] != 3:
        raise ValueError(f"write_mp4 takes one video (3, F, H, W), got {tuple(video.shape)}")
    frames = _frames(video)
    _, h, w, _ = frames.shape
    rate = Fraction(fps or DEFAULT_FPS).limit_denominator(1001)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height = w, h
        stream.pix_fmt = "yuv420p" if h % 2 == 0 and w % 2 == 0 else "yuv444p"
        stream.options = {"crf": CRF}
        sound = _audio_stream(container, audio) if audio is not None else None
        for frame in frames:
            picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            container.mux(stream.encode(picture))
        container.mux(stream.encode())
        if sound is not None:
            _encode_audio(container, sound, audio)
    return path


def _frames(video: torch.Tensor) -> np.ndarray:
    """``video (3, F, H, W)``, uint8 or float in [0, 1] -> ``(F, H, W, 3)`` uint8."""
    pixels = video.cpu() if video.dtype == torch.uint8 else quantize(video)
    return pixels.permute(1, 2, 3, 0).numpy()


def _audio_stream(container, audio: Audio):
    channels = audio.waveform.shape[1]
    if audio.waveform.ndim != 3 or len(audio) != 1 or channels not in LAYOUTS:
        raise ValueError(
            f"write_mp4 takes one clip of mono or stereo sound (1, 1 or 2, S), got {tuple(audio.waveform.shape)}"
        )
    rate = audio.sample_rate if audio.sample_rate in AAC_RATES else 48000
    stream = container.add_stream("aac", rate=rate)
    stream.layout = LAYOUTS[channels]
    return stream


def _encode_audio(container, stream, audio: Audio) -> None:
    """The clip as one frame at its own rate: PyAV's encoder resamples it to the stream's rate
    (FFmpeg's swresample) and cuts it into AAC's 1024-sample frames."""
    clip = audio.waveform[0].float().clamp(-1.0, 1.0).numpy()  # (C, S)
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(clip), format="fltp", layout=stream.layout.name)
    frame.sample_rate, frame.pts, frame.time_base = audio.sample_rate, 0, Fraction(1, audio.sample_rate)
    container.mux(stream.encode(frame))
    container.mux(stream.encode())


def write_video_sample(
    out: Path, name: str, video: torch.Tensor, fps: float | None, audio: Audio | None
) -> Path:
    """``out/name.mp4`` and its frames ``out/name/frame_0000.png, ...``; returns the mp4's path."""
    frames = out / name
    frames.mkdir(parents=True, exist_ok=True)
    for i, frame in enumerate(_frames(video)):
        Image.fromarray(np.ascontiguousarray(frame)).save(frames / f"frame_{i:04d}.png")
    try:
        return write_mp4(out / f"{name}.mp4", video, fps, audio)
    except av.FFmpegError as e:
        raise DiffrlError(f"could not write {out / f'{name}.mp4'}: FFmpeg said {e}") from e
