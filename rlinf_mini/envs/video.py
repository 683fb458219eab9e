"""Eval videos: the first few sub-envs of an eval run, one gif each, with the instruction and the outcome drawn.

    rec = EvalVideoRecorder(cfg.env.eval.video_cfg, env, obs)     # obs: the reset obs of `env`
    rec.add(env, obs, rewards, terminations)                       # after every chunk_step
    rec.save("results/run/videos/step_10", prefix="rank0")         # -> rank0_env0.gif, rank0_env1.gif, ...

Frames are the obs images when the obs is a dict with `images` (PixelReach), else `env.render()` (gymnasium envs made
with render_mode 'rgb_array' when video_cfg.save_video is set). Small frames are upscaled (nearest neighbour) to at
least 192 pixels, large ones scaled down to 256; a text band below shows the instruction (or the env id), the return
so far and SUCCESS once the episode has terminated successfully. A sub-env's recording stops at the end of its episode
or after 200 frames. Written with Pillow.

RLinf counterpart: `rlinf/envs/wrappers/record_video.py` (RecordVideo, `video_cfg.save_video/info_on_video/
video_base_dir`); RLinf writes mp4 through imageio, here gifs, which need no codec.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from rlinf_mini.config import VideoConfig

MIN_SIDE = 192
"""Frames are upscaled by an integer factor until they are at least this many pixels wide."""
MAX_SIDE = 256
"""Larger frames (MuJoCo renders 480 x 480) are scaled down to this width, to keep the gifs small."""
MAX_FRAMES = 200
"""A recording stops after this many frames (long MuJoCo episodes)."""
TEXT_BAND = 30
FRAME_MS = 400


class EvalVideoRecorder:
    def __init__(self, cfg: VideoConfig, env, obs):
        self.cfg = cfg
        self.n = min(cfg.num_videos, env.num_envs)
        self.label = env.cfg.init_params.id
        self.frames: list[list[Image.Image]] = [[] for _ in range(self.n)]
        self.returns = [0.0] * self.n
        self.success = [False] * self.n
        self.done = [False] * self.n
        self._capture(env, obs)

    def _images(self, env, obs) -> np.ndarray:
        """uint8 [n, H, W, 3] of the recorded sub-envs."""
        images = obs["images"] if isinstance(obs, dict) else env.render()  # [B, 3, H, W]
        return images[: self.n].permute(0, 2, 3, 1).contiguous().numpy()

    def _capture(self, env, obs) -> None:
        texts = list(obs["task_descriptions"][: self.n]) if isinstance(obs, dict) else [self.label] * self.n
        for i, img in enumerate(self._images(env, obs)):
            if (self.done[i] and self.frames[i]) or len(self.frames[i]) >= MAX_FRAMES:
                continue
            self.frames[i].append(self._frame(img, texts[i], i))

    def _frame(self, img: np.ndarray, text: str, i: int) -> Image.Image:
        h, w = img.shape[:2]
        if w > MAX_SIDE:
            pic = Image.fromarray(img).resize((MAX_SIDE, h * MAX_SIDE // w), Image.BILINEAR)
        else:
            scale = max(1, -(-MIN_SIDE // w))  # ceil: pixel art stays sharp
            pic = Image.fromarray(img).resize((w * scale, h * scale), Image.NEAREST)
        if not self.cfg.info_on_video:
            return pic
        out = Image.new("RGB", (pic.width, pic.height + TEXT_BAND), (40, 40, 40))
        out.paste(pic, (0, 0))
        draw = ImageDraw.Draw(out)
        draw.text((3, pic.height + 2), text, fill=(255, 255, 255))
        status = f"return {self.returns[i]:.2f}" + ("  SUCCESS" if self.success[i] else "")
        draw.text((3, pic.height + 15), status, fill=(90, 230, 90) if self.success[i] else (220, 220, 220))
        return out

    def add(self, env, obs, rewards: torch.Tensor, terminations: torch.Tensor) -> None:
        """Record the frame after a chunk step; rewards / terminations [B, C] of that step."""
        for i in range(self.n):
            if self.done[i]:
                continue
            self.returns[i] += float(rewards[i].sum())
            if bool(terminations[i].any()):
                self.success[i] = True
        self._capture(env, obs)
        for i in range(self.n):  # after the capture: the frame that shows the end is kept, later ones are not
            ended = bool(terminations[i].any()) or getattr(env, "finished", None) is not None and bool(
                torch.as_tensor(env.finished)[i])
            self.done[i] = self.done[i] or ended

    def save(self, folder: str | Path, prefix: str) -> list[Path]:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for i, frames in enumerate(self.frames):
            path = folder / f"{prefix}_env{i}.gif"
            frames[0].save(path, save_all=True, append_images=frames[1:], duration=FRAME_MS, loop=0)
            paths.append(path)
        return paths
