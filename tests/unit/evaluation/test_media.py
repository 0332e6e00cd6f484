"""Videos to .mp4 files (``diffrl/evaluation/media.py``): what FFmpeg reads back is what was written:
the frames, their size and rate, and the sound's channels, rate and length; odd sizes are kept
(4:4:4), rates AAC does not define are resampled to 48 kHz."""

from __future__ import annotations

import av
import pytest
import torch

from diffrl.core.rollout import Audio
from diffrl.evaluation.media import write_mp4


def read_back(path) -> dict:
    with av.open(str(path)) as container:
        [video] = container.streams.video
        out = {
            "frames": sum(1 for _ in container.decode(video=0)),
            "size": (video.width, video.height),
            "rate": video.average_rate,
            "pix_fmt": video.codec_context.pix_fmt,
        }
        if container.streams.audio:
            [sound] = container.streams.audio
            out["audio"] = (sound.rate, sound.channels, float(sound.duration * sound.time_base))
        return out


@pytest.mark.parametrize(
    "size, rate, wrote_rate, pix_fmt",
    [((32, 48), 24_000, 24_000, "yuv420p"), ((31, 33), 22_222, 48_000, "yuv444p")],
    ids=["even-aac-rate", "odd-size-other-rate"],
)
def test_an_mp4_reads_back_as_written(tmp_path, size, rate, wrote_rate, pix_fmt):
    h, w = size
    video = (torch.rand(3, 7, h, w, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
    sound = Audio(torch.rand(1, 2, rate // 4) * 2 - 1, rate)  # 0.25 s of stereo noise
    got = read_back(write_mp4(tmp_path / "clip.mp4", video, 16.0, sound))
    assert (got["frames"], got["size"], got["rate"], got["pix_fmt"]) == (7, (w, h), 16, pix_fmt)
    wrote, channels, seconds = got["audio"]
    assert (wrote, channels) == (wrote_rate, 2)
    assert abs(seconds - 0.25) <= 1e-3  # the mp4's edit list counts in 1/1000 s


def test_a_silent_video_has_no_sound_track_and_a_mono_one_is_mono(tmp_path):
    video = torch.rand(3, 3, 16, 16)  # float in [0, 1]
    assert "audio" not in read_back(write_mp4(tmp_path / "silent.mp4", video, None))
    mono = Audio(torch.zeros(1, 1, 800), 8_000)
    assert read_back(write_mp4(tmp_path / "mono.mp4", video, None, mono))["audio"][:2] == (8_000, 1)


def test_more_than_two_channels_are_refused(tmp_path):
    with pytest.raises(ValueError, match="mono or stereo"):
        write_mp4(tmp_path / "x.mp4", torch.rand(3, 2, 16, 16), 24.0, Audio(torch.zeros(1, 6, 100), 48_000))
