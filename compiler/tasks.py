"""Task extraction: which templates can compute each conv2d / dense of an optimized
graph, with the AutoTVM workload its records are keyed by.

A layer has one candidate per template that computes it, in the order the device class
prefers (TVM's op strategy): ``conv2d_NCHWc.x86`` then ``conv2d_nchw.cuda`` on a CPU,
the reverse on a GPU; 3x3 stride-1 layers add both Winograd templates after them
(``conv2d_nchw_winograd.cuda``, then ``conv2d_NCHWc_winograd.x86``), 1x1 layers without
padding the CPU packed-GEMM template ``conv2d_NCHWc_1x1.x86``, every other layer its
implicit-GEMM form ``conv2d_NCHWc_gemm.x86``. On a CPU the template
whose default config runs fastest comes first (``_cpu_preferred``): Winograd on 3x3
stride-1 layers of at least ``WINOGRAD_MIN_CHANNELS`` input channels (issue 17: untuned
ResNet-50 and DenseNet-121 1.2-1.3x faster), ``WINOGRAD_MIN_OUT_CHANNELS`` output
channels (``WINOGRAD_MIN_OUT_CHANNELS_AVX2`` on 8 lanes) and ``WINOGRAD_MIN_SIZE``
pixels a side, the 1x1 one on 1x1 layers of a 16-lane (AVX-512) device, the implicit
GEMM on outputs at most ``GEMM_MAX_WIDTH`` wide of an 8-lane (AVX2) device
(``gemm_preferred``), the direct one elsewhere. Tuning takes the preferred one and the
device class's other templates (on a CPU the direct, Winograd, 1x1 and GEMM ones; on a
GPU Winograd); a build takes, per layer, the candidate with the fastest record measured on
this device (TVM's select_implementation), else another device's record (on a CPU only
the preferred template's), else the preferred one's default.
Layers with equal workloads (ResNet repeats its blocks) are one task: tuned once, used
everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.ir import Graph, Node
from compiler.templates import get_template
from compiler.templates.base import AVX2_LANES, AVX512_LANES
from schemas import Target, Workload
from schemas.workload import tensor_arg

CONV_GPU, CONV_CPU = "conv2d_nchw.cuda", "conv2d_NCHWc.x86"
WINOGRAD, DEPTHWISE, CONV_INT8 = ("conv2d_nchw_winograd.cuda", "depthwise_conv2d_nchw.cuda",
                                  "conv2d_nchw_int8.cuda")
WINOGRAD_CPU = "conv2d_NCHWc_winograd.x86"
CONV1X1_CPU = "conv2d_NCHWc_1x1.x86"
GEMM_CPU = "conv2d_NCHWc_gemm.x86"
DENSE_SMALL, DENSE_LARGE, DENSE_CPU = ("dense_small_batch.gpu", "dense_large_batch.gpu",
                                       "dense_pack.x86")
# AutoTVM's CUDA strategy switches dense to the tiled schedule from this batch size on.
LARGE_BATCH = 32
# Below this many input channels Winograd's transforms cost more than its saved
# multiplies (the C=3 stem): the direct template stays first there.
WINOGRAD_MIN_CHANNELS = 16
# Nor does it pay under this many output channels or pixels a side (``_cpu_preferred``);
# on AVX2's 8 lanes from fewer output channels (``winograd_preferred``)
WINOGRAD_MIN_OUT_CHANNELS = 64
WINOGRAD_MIN_OUT_CHANNELS_AVX2 = 32
WINOGRAD_MIN_SIZE = 14
# On AVX2's 8 lanes the implicit GEMM's default runs layers whose output is at most this
# wide faster than the direct one (``_cpu_preferred``)
GEMM_MAX_WIDTH = 14
# and at least this many input channels: a graph input of a few (the stem's 3) comes in
# plain NCHW, where the GEMM reads its padding through a select per value (1.5x slower)
GEMM_MIN_CHANNELS = 16
# The templates tuning covers on each device class (besides the preferred one).
TUNED_CPU = frozenset({CONV_CPU, WINOGRAD_CPU, CONV1X1_CPU, GEMM_CPU})
TUNED_GPU = frozenset({WINOGRAD})


@dataclass
class Task:
    """One workload to tune, and the layers (node names) that will run its kernel."""

    workload: Workload
    layers: list[str] = field(default_factory=list)

    @property
    def template(self) -> str:
        return self.workload.template

    @property
    def flops(self) -> int:
        return get_template(self.template).flops(self.workload)

    @property
    def total_flops(self) -> int:
        return self.flops * len(self.layers)


def _conv_args(node: Node) -> list:
    return [tensor_arg(node.inputs[0].ty.shape), tensor_arg(node.inputs[1].ty.shape),
            list(node.attr("strides")), list(node.attr("padding")), list(node.attr("dilation"))]


def _winograd_fits(node: Node) -> bool:
    """Winograd F(m, 3): 3x3 kernels, stride 1, no dilation (TVM's rule)."""
    kh, kw = node.inputs[1].ty.shape[2:]
    return ((kh, kw) == (3, 3) and tuple(node.attr("strides")) == (1, 1)
            and tuple(node.attr("dilation")) == (1, 1))


def _one_by_one_fits(node: Node) -> bool:
    """The 1x1 packed-GEMM template: 1x1 kernels without padding (any stride)."""
    kh, kw = node.inputs[1].ty.shape[2:]
    return (kh, kw) == (1, 1) and not any(node.attr("padding"))


def _conv_candidates(node: Node, cpu: bool, lanes: int) -> list[Workload]:
    data, weight = node.inputs[0].ty, node.inputs[1].ty
    if data.dtype == "int8":
        if node.attr("groups") != 1:
            return []
        return [Workload(template=CONV_INT8, args=[
            tensor_arg(data.shape, "int8"), tensor_arg(weight.shape, "int8"),
            list(node.attr("strides")), list(node.attr("padding")),
            list(node.attr("dilation")), "int32"])]
    if node.attr("groups") != 1:
        channels = data.shape[1]
        if node.attr("groups") != channels or weight.shape[1] != 1:
            return []  # grouped, not depthwise (int8, or not split by fuse_ops): plain kernel
        # TVM's depthwise weight is [C, multiplier, kh, kw]: the same memory as OIHW
        # [C * multiplier, 1, kh, kw], as ONNX stores it
        shape = (channels, weight.shape[0] // channels, *weight.shape[2:])
        return [Workload(template=DEPTHWISE, args=[
            tensor_arg(data.shape), tensor_arg(shape), *_conv_args(node)[2:], "float32"])]
    gpu = Workload(template=CONV_GPU, args=[*_conv_args(node), "float32"])
    host = Workload(template=CONV_CPU, args=[*_conv_args(node), "NCHW", "NCHW", "float32"])
    found = [host, gpu] if cpu else [gpu, host]
    if _winograd_fits(node):
        found.append(Workload(template=WINOGRAD, args=gpu.args))
        found.append(Workload(template=WINOGRAD_CPU, args=host.args))
    if _one_by_one_fits(node):
        found.append(Workload(template=CONV1X1_CPU, args=host.args))
    else:  # an unpadded 1x1 is the 1x1 template's GEMM already
        found.append(Workload(template=GEMM_CPU, args=host.args))
    if cpu:
        first = _cpu_preferred(node, lanes)
        found.sort(key=lambda w: w.template != first)  # stable: the rest keep their order
    return found


def _cpu_preferred(node: Node, lanes: int) -> str:
    """The CPU template whose default config runs ``node`` fastest (issue 17;
    bench/default_choice.py, bench/winograd.py --cpu): Winograd on 3x3 stride-1 layers
    with enough input channels to pay for its transforms, enough output channels
    (``WINOGRAD_MIN_OUT_CHANNELS``) and an image of at least ``WINOGRAD_MIN_SIZE``
    pixels a side, the direct template elsewhere. Why the last two: its transforms cost
    per channel and pixel what its GEMM saves per channel pair, and its tiles cover 8x8
    of a 7x7 image with a transformed filter 16/9 (F(2x2)) to 4x (F(4x4)) the direct
    one's bytes; on a 2-core AVX-512 Xeon the direct default ran DenseNet-121's 128->32
    layers (14x14 0.06 against 0.08-0.12 ms, 28x28 0.18 against 0.20-0.27) and
    ResNet-50's 512->512 at 7x7 (0.73 against 0.84 ms) faster, the whole DenseNet-121
    1.10-1.13x (8-lane defaults 1.09x) and ResNet-50 1.02x (bench/winograd_rule.py).
    The 1x1 template on 1x1 layers without padding where the device has
    ``AVX512_LANES`` lanes (``lanes``: ``simd_lanes`` of its limits, 0 unknown): with its
    16-lane default (4 pixels x 64 channels) untuned builds ran 1.00-1.07x (ResNet-50)
    and 1.01-1.09x (DenseNet-121) faster than on the direct default (bench/conv1x1.py
    --model, a 2-core AVX-512 Xeon); not elsewhere, where its 8-lane default ran at
    0.82-1.01x the direct default's speed (a Zen 1 AVX2 VM), so a build takes it there
    only where its record measured faster. The implicit GEMM (``conv2d_NCHWc_gemm.x86``)
    on other layers whose output is at most ``GEMM_MAX_WIDTH`` pixels wide on a device of
    8 lanes (AVX2): the direct template's register block must divide the output width
    (7 or 14 pixels x 16 channels there: more accumulators than AVX2's 16 registers),
    the GEMM's is any 6 pixels of the image (``gemm_preferred``); its default ran
    ResNet-50's 14x14 and 7x7 outputs in 0.63-0.87x the direct default's time and the
    wider ones at 0.96-1.04x (bench/conv_gemm.py, a Zen 3 AVX2 VM). Not measured on 16
    lanes, where the direct block (7 x 16 in one vector) fits the 32 registers, nor on 4
    (SSE, NEON): they keep the direct template."""
    data, weight = node.inputs[0].ty.shape, node.inputs[1].ty.shape
    if _winograd_fits(node) and winograd_preferred(data[1], weight[0], *data[2:], lanes):
        return WINOGRAD_CPU
    if lanes >= AVX512_LANES and _one_by_one_fits(node):
        return CONV1X1_CPU
    if (lanes == AVX2_LANES and not _one_by_one_fits(node)
            and gemm_preferred(data[1], node.ty.shape[3])):
        return GEMM_CPU
    return CONV_CPU


def gemm_preferred(channels: int, out_width: int) -> bool:
    """Whether an 8-lane CPU build runs a conv (not an unpadded 1x1) of these input
    channels and output width on the implicit GEMM untuned (``_cpu_preferred``)."""
    return out_width <= GEMM_MAX_WIDTH and channels >= GEMM_MIN_CHANNELS


def winograd_preferred(channels: int, out_channels: int, height: int, width: int,
                       lanes: int = 0) -> bool:
    """Whether a CPU build runs a 3x3 stride-1 conv of these input and output channels
    on an input of ``height`` x ``width`` on Winograd untuned (``_cpu_preferred``), on a
    device of ``lanes`` SIMD lanes. On 8 (AVX2) from ``WINOGRAD_MIN_OUT_CHANNELS_AVX2``
    output channels: on a Zen 3 VM Winograd's default ran DenseNet-121's 128 -> 32 layers
    in 0.60-0.62x the direct default's time at 28x28 and 14x14, and the untuned model
    1.05-1.07x faster with Winograd on them from 28x28 up (docs/BENCHMARKS.md); the 64 of
    the other devices was measured on AVX-512."""
    least = WINOGRAD_MIN_OUT_CHANNELS_AVX2 if lanes == AVX2_LANES else WINOGRAD_MIN_OUT_CHANNELS
    return (channels >= WINOGRAD_MIN_CHANNELS and out_channels >= least
            and min(height, width) >= WINOGRAD_MIN_SIZE)


def candidates(node: Node, target: Target | None = None, lanes: int = 0) -> list[Workload]:
    """The template workloads that can compute ``node``, preferred first (on a CPU the
    template ``_cpu_preferred`` names for a device of ``lanes`` SIMD lanes, then the
    direct ones, Winograd's and the 1x1 or GEMM one); empty for ops no template covers (a
    grouped conv other than depthwise runs a plain kernel; ``fuse_ops`` splits float
    ones into per-group convs, which templates cover)."""
    cpu = target is not None and target.device_class == "cpu"
    # CPU templates pack the weight at build time: only a constant weight can be packed
    packable = node.inputs[1].is_const if len(node.inputs) > 1 else False
    found: list[Workload] = []
    if node.op in ("nn.conv2d", "fused.conv2d"):
        found = _conv_candidates(node, cpu, lanes)
    elif node.op in ("nn.dense", "fused.dense"):
        data, weight = node.inputs[0].ty.shape, node.inputs[1].ty.shape
        args = [tensor_arg(data), tensor_arg(weight), None, "float32"]
        gpu = Workload(template=DENSE_LARGE if data[0] >= LARGE_BATCH else DENSE_SMALL, args=args)
        host = Workload(template=DENSE_CPU, args=args)
        found = [host, gpu] if cpu else [gpu, host]
    return [w for w in found if packable or not get_template(w.template).packs_weight]


def tuning_candidates(node: Node, target: Target | None = None,
                      lanes: int = 0) -> list[Workload]:
    """What tuning covers for ``node``, preferred first (what an untuned or partly tuned
    build runs): on a CPU the direct, Winograd, 1x1 and GEMM templates where they apply, on a
    GPU the preferred template and Winograd, so a build can take whichever of them
    measured faster."""
    found = candidates(node, target, lanes)
    cpu = target is not None and target.device_class == "cpu"
    extra = TUNED_CPU if cpu else TUNED_GPU
    return found[:1] + [w for w in found[1:] if w.template in extra]


def node_workload(node: Node, target: Target | None = None) -> Workload | None:
    """The preferred template workload of ``node``, or None when no template fits it."""
    found = candidates(node, target)
    return found[0] if found else None


def extract_tasks(graph: Graph, target: Target | None = None,
                  every_candidate: bool = False, lanes: int = 0) -> list[Task]:
    """Tasks in first-use order: each conv2d/dense layer's ``tuning_candidates`` (with
    ``every_candidate``, each of its candidates: what a build chooses among), preferred
    first for a device of ``lanes`` SIMD lanes."""
    tasks: dict[str, Task] = {}
    live = graph.live()
    for node in graph.nodes:
        if id(node) not in live:
            continue
        found = (candidates(node, target, lanes) if every_candidate
                 else tuning_candidates(node, target, lanes))
        for workload in found:
            task = tasks.setdefault(workload.key, Task(workload))
            task.layers.append(node.name or node.op)
    return list(tasks.values())
