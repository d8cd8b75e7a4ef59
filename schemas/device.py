"""What a device can run: the limits a config is checked against before it is built."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DeviceLimits(BaseModel):
    """Per-block limits, as a GPU driver reports them (AutoTVM's gpu verify pass uses the same)."""

    model_config = ConfigDict(frozen=True)

    max_threads_per_block: int = Field(1024, gt=0)
    max_thread_x: int = Field(1024, gt=0)
    max_thread_y: int = Field(1024, gt=0)
    max_thread_z: int = Field(64, gt=0)
    max_shared_memory_per_block: int = Field(48 * 1024, gt=0)
    # Per-thread register tile (accumulators), in elements. A GPU has at most 255
    # registers a thread; past that a kernel spills, and on PoCL a 1024-element tile
    # took 30 s to compile. Every TopHub conv2d_nchw.cuda record stays within 128.
    max_local_elements: int = Field(256, gt=0)
    warp_size: int = Field(32, gt=0)
    compute_units: int = Field(1, gt=0)
