"""What a device can run: the limits a config is checked against before it is built."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


# A worker's registration is the only source of these: bound them like every id (32 bits).
MAX_LIMIT = 2**31 - 1


class DeviceLimits(BaseModel):
    """Per-block limits, as a GPU driver reports them (AutoTVM's gpu verify pass uses the same)."""

    model_config = ConfigDict(frozen=True)

    max_threads_per_block: int = Field(1024, gt=0, le=MAX_LIMIT)
    max_thread_x: int = Field(1024, gt=0, le=MAX_LIMIT)
    max_thread_y: int = Field(1024, gt=0, le=MAX_LIMIT)
    max_thread_z: int = Field(64, gt=0, le=MAX_LIMIT)
    max_shared_memory_per_block: int = Field(48 * 1024, gt=0, le=MAX_LIMIT)
    # Per-thread register tile (accumulators), in elements. A GPU has at most 255
    # registers a thread; past that a kernel spills, and on PoCL a 1024-element tile
    # took 30 s to compile. Every TopHub conv2d_nchw.cuda record stays within 128.
    max_local_elements: int = Field(256, gt=0, le=MAX_LIMIT)
    warp_size: int = Field(32, gt=0, le=MAX_LIMIT)
    compute_units: int = Field(1, gt=0, le=MAX_LIMIT)
    # float32 lanes of the device's native vector (OpenCL's NATIVE_VECTOR_WIDTH_FLOAT:
    # 8 on AVX2, 16 on AVX-512); 0 where unknown. The CPU templates' defaults size their
    # register tiles by it, as AutoTVM's x86 fallbacks do by the target's -mcpu.
    simd_lanes: int = Field(0, ge=0, le=1024)
