"""Inputs made up for a model when the operator sent no data, shaped by what the graph says.

Standard-normal noise is a poor stand-in: token ids past the vocabulary crash the
model, masks of arbitrary integers mean nothing, a sequence length of 1 exercises
no attention, and INT8 judged on noise where real inputs are images refuses models
that agree 100 % on real data. So:

* integer inputs that index an embedding table (``family.embedding_vocab``) get
  ids below the table's row count (0 where the mask says padding); inputs named
  ``*position*`` get ``0..seq-1``;
* inputs named ``*mask*`` get 0/1 with a prefix of ones of random length;
* dynamic dimensions get the operator's ``--dim name=value``, else a realistic
  default: ``sequence`` for integer inputs and axes named like a sequence,
  ``image`` for the spatial axes of 4-D float inputs, 1 otherwise;
* 4-D float inputs get smooth images (a coarse random grid, bilinearly upsampled,
  channels correlated, stretched to a random contrast, a little noise), in 0..1, or 0..255 when the graph divides
  or subtracts like raw pixels, or ImageNet-normalised when its first op is the
  convolution itself;
* anything else stays standard normal (booleans random).

Seeded: the same push gets the same samples."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from central.errors import BadRequest
from central.quantize.calibration import Samples
from central.quantize.family import embedding_vocab
from fleetwire.manifest import TensorSpec

DEFAULT_SEQUENCE = 32
DEFAULT_IMAGE = 224
_SEQUENCE_NAME = re.compile(r"seq|sequence|length|len|token|time|step", re.IGNORECASE)
_IMAGENET_MEAN, _IMAGENET_STD = 0.449, 0.226
_NORMALIZING_OPS = {"Sub", "Div", "Mul", "Add"}


@dataclass(frozen=True)
class InputHints:
    """What the graph says about its inputs' values and dimension names."""

    #: Integer input → rows of the embedding table it indexes.
    vocab: dict[str, int] = field(default_factory=dict)
    #: Input → the name of each axis (``dim_param``; None for fixed or unnamed axes).
    dim_names: dict[str, list[str | None]] = field(default_factory=dict)
    #: 4-D float input → pixel scale: 255.0, 1.0, or 0.0 for "already normalised".
    pixel_scale: dict[str, float] = field(default_factory=dict)

    @property
    def dynamic_names(self) -> set[str]:
        """Every named dynamic dimension beyond the batch axis."""
        return {n for names in self.dim_names.values() for n in names[1:] if n}


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.data_location != 1}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _pixel_scale(model: onnx.ModelProto, name: str, constants: dict[str, np.ndarray]) -> float:
    """255 or 1 when the first op normalises raw pixels; 0 (normalised) when it is a Conv."""
    first = next((n for n in model.graph.node if name in n.input), None)
    if first is None or first.op_type not in _NORMALIZING_OPS:
        return 0.0
    other = next((constants[i] for i in first.input if i != name and i in constants), None)
    if other is None or other.size == 0:
        return 1.0
    magnitude = float(np.max(np.abs(other)))
    if first.op_type == "Mul":
        return 255.0 if magnitude < 0.01 else 1.0
    return 255.0 if magnitude > 1.5 else 1.0


def input_hints(model: onnx.ModelProto) -> InputHints:
    """Read vocabularies, dimension names and pixel scales from the graph."""
    constants = _constants(model)
    initializers = {i.name for i in model.graph.initializer}
    dim_names: dict[str, list[str | None]] = {}
    pixel_scale: dict[str, float] = {}
    for graph_input in model.graph.input:
        if graph_input.name in initializers:
            continue
        tensor = graph_input.type.tensor_type
        dim_names[graph_input.name] = [d.dim_param or None for d in tensor.shape.dim]
        if tensor.elem_type == onnx.TensorProto.FLOAT and len(tensor.shape.dim) == 4:
            pixel_scale[graph_input.name] = _pixel_scale(model, graph_input.name, constants)
    return InputHints(embedding_vocab(model), dim_names, pixel_scale)


def check_dims(dims: dict[str, int], hints: InputHints) -> None:
    """400 for a ``--dim`` name that is no dynamic dimension of the model."""
    known = hints.dynamic_names
    for name, value in dims.items():
        if name not in known:
            have = ", ".join(sorted(known)) or "none"
            raise BadRequest(f"--dim {name}={value}: the model has no dynamic dimension {name!r} (it has: {have})")


@dataclass(frozen=True)
class Sizes:
    """How big generated inputs are: the operator's dims and the defaults."""

    dims: dict[str, int] = field(default_factory=dict)
    sequence: int = DEFAULT_SEQUENCE
    image: int = DEFAULT_IMAGE


def _axis(spec: TensorSpec, axis: int, name: str | None, sizes: Sizes) -> int:
    """The size of one non-batch axis."""
    if spec.shape[axis] >= 0:
        return spec.shape[axis]
    if name and name in sizes.dims:
        return sizes.dims[name]
    if np.issubdtype(np.dtype(spec.dtype), np.integer) or (name and _SEQUENCE_NAME.search(name)):
        return sizes.sequence
    if len(spec.shape) == 4 and axis >= 2:
        return sizes.image
    return 1


def sample_shape(spec: TensorSpec, n: int, hints: InputHints, sizes: Sizes) -> tuple[int, ...]:
    """``(n, ...)`` for one input, every dynamic axis resolved."""
    if not spec.shape:
        raise BadRequest(f"input {spec.name!r} is a scalar; it has no batch dimension to sample")
    names = hints.dim_names.get(spec.name) or [None] * len(spec.shape)
    return (n, *(_axis(spec, a, names[a] if a < len(names) else None, sizes) for a in range(1, len(spec.shape))))


def _smooth_images(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Images in 0..1: a coarse grid upsampled bilinearly, channels correlated."""
    n, c, h, w = shape
    grid = int(rng.integers(3, 9))
    coarse = 0.6 * rng.random((n, 1, grid, grid)) + 0.4 * rng.random((n, c, grid, grid))
    rows = np.array([np.interp(np.linspace(0, grid - 1, h), np.arange(grid), e) for e in np.eye(grid)]).T
    cols = np.array([np.interp(np.linspace(0, grid - 1, w), np.arange(grid), e) for e in np.eye(grid)]).T
    images = np.einsum("hg,ncgk,wk->nchw", rows, coarse, cols)
    low = images.min(axis=(1, 2, 3), keepdims=True)
    span = np.maximum(images.max(axis=(1, 2, 3), keepdims=True) - low, 1e-6)
    lo, hi = rng.uniform(0.0, 0.3, size=(n, 1, 1, 1)), rng.uniform(0.7, 1.0, size=(n, 1, 1, 1))
    images = lo + (images - low) / span * (hi - lo)  # each image's own contrast, as photos have
    return np.clip(images + rng.normal(0.0, 0.01, size=shape), 0.0, 1.0)


def _mask(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """1 for a prefix of random length (at least one) along the last axis, 0 after."""
    length = shape[-1]
    ends = rng.integers(max(1, length // 4), length + 1, size=shape[:-1])
    return (np.arange(length) < ends[..., None]).astype(np.int64)


def _values(spec: TensorSpec, shape: tuple[int, ...], hints: InputHints, rng: np.random.Generator) -> np.ndarray:
    """Values for one input (see the module docstring)."""
    dtype = np.dtype(spec.dtype)
    lowered = spec.name.lower()
    if "mask" in lowered:
        return _mask(shape, rng).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        if "position" in lowered:
            return np.broadcast_to(np.arange(shape[-1]), shape).astype(dtype)
        return rng.integers(0, hints.vocab.get(spec.name, 10), size=shape).astype(dtype)
    if spec.name in hints.pixel_scale:
        images = _smooth_images(shape, rng)
        scale = hints.pixel_scale[spec.name]
        return (images * scale if scale else (images - _IMAGENET_MEAN) / _IMAGENET_STD).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _pad_ids(samples: Samples, hints: InputHints) -> None:
    """Ids where a same-shaped mask says padding become 0, as tokenizers pad."""
    masks = [a for name, a in samples.items() if "mask" in name.lower()]
    for name in hints.vocab:
        ids = samples.get(name)
        for mask in masks:
            if ids is not None and mask.shape == ids.shape:
                ids[mask == 0] = 0


def generated_samples(
    inputs: list[TensorSpec], n: int, seed: int = 0, *, hints: InputHints | None = None, sizes: Sizes | None = None
) -> Samples:
    """``n`` samples for every input (see the module docstring)."""
    rng = np.random.default_rng(seed)
    hints = hints or InputHints()
    sizes = sizes or Sizes()
    samples = {spec.name: _values(spec, sample_shape(spec, n, hints, sizes), hints, rng) for spec in inputs}
    _pad_ids(samples, hints)
    return samples


def elements_per_sample(inputs: list[TensorSpec], hints: InputHints, sizes: Sizes) -> int:
    """Values one generated sample holds over all inputs (the budget's unit)."""
    return sum(int(np.prod(sample_shape(spec, 1, hints, sizes))) for spec in inputs)
