"""The workload interface: what codl needs of a model and its input pipeline, and where it finds
one.

A workload is any object with these members (the :class:`Workload` protocol); codl calls
nothing else, and the shipped workloads (resnet50, resnet18, resnet_tiny, cosmoflow, gpt2_small,
gpt_tiny) are objects of this module written against it:

required
  ``name`` (str), ``dataset_kind`` (a :class:`~codl.spec.DatasetKind` or its value: the data
  set its runs read), ``build_model(spec)`` (an ``nn.Module`` from the run's
  :class:`~codl.spec.WorkloadSpec`), ``open_dataset(root, spec)`` (a map-style data set of the
  directory ``root`` whose samples are ``(input tensor, target tensor or int, timing row)``,
  the row from :func:`codl.harness.data.timing_row`: what the loader level records per item and
  what the ring hand-off takes), ``synthetic_batch(spec, device)`` (the ``(inputs, targets)``
  of the modes that do not load), ``loss(spec)`` (a callable ``(model output, targets) ->
  scalar``; the output is given in fp32).
optional
  ``description`` (str); ``channels_last`` (bool: whether ``workload.channels_last`` applies,
  4-D image inputs only); ``collate(samples)`` (a :class:`codl.harness.data.Batch` with its
  timing rows; default :func:`codl.harness.data.collate`, which stacks; the ring hand-off
  stacks into its slots itself and refuses a workload with its own); ``generate_dataset(spec,
  out)`` (write the files of the :class:`~codl.spec.DatasetSpec` into the empty directory
  ``out``, return the number of samples: data sets of kind ``workload``; it may also index data
  that exists elsewhere); ``ddp_options(spec)`` (keyword arguments for
  ``DistributedDataParallel``, of :data:`DDP_OPTIONS`); ``problems(run_spec)`` (one line per
  setting the workload cannot run, checked by ``codl plan`` and the workflow).

``workload.model`` names one in three ways: a registered name (:func:`names`), an entry point of
the group ``codl.workloads`` (an installed package's ``[project.entry-points."codl.workloads"]``),
or ``package.module:attribute``. The attribute or entry point is a workload, or a factory (a
callable without arguments, a class included) that returns one. :func:`get` resolves a name and
checks the object; every failure is one :class:`~codl.errors.ConfigError` line naming the
reference and what was expected.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from codl.errors import ConfigError
from codl.spec import DatasetKind, DatasetSpec, Handoff, RunSpec, WorkloadSpec

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

ENTRY_POINT_GROUP = "codl.workloads"
REQUIRED = ("build_model", "open_dataset", "synthetic_batch", "loss")
OPTIONAL = ("collate", "generate_dataset", "ddp_options", "problems")
#: The DistributedDataParallel keywords a workload may set; the harness sets the rest
#: (device ids, bucket size) from the run spec.
DDP_OPTIONS = frozenset(
    {"find_unused_parameters", "static_graph", "gradient_as_bucket_view", "broadcast_buffers"}
)
# A Python dotted module path, optionally with ":attribute.path".
_REFERENCE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?\Z")


@runtime_checkable
class Workload(Protocol):
    """The members codl calls (see the module docstring for the optional ones)."""

    name: str
    dataset_kind: DatasetKind | str

    def build_model(self, spec: WorkloadSpec) -> torch.nn.Module: ...

    def open_dataset(self, root: Path, spec: WorkloadSpec) -> Dataset[Any]: ...

    def synthetic_batch(
        self, spec: WorkloadSpec, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def loss(self, spec: WorkloadSpec) -> Callable[[Any, Any], Any]: ...


@dataclass(frozen=True)
class Loaded:
    """A checked workload as codl uses it: the optional members with their defaults."""

    ref: str
    impl: Any

    @property
    def name(self) -> str:
        return str(self.impl.name)

    @property
    def dataset_kind(self) -> DatasetKind:
        return DatasetKind(self.impl.dataset_kind)

    @property
    def description(self) -> str:
        return str(getattr(self.impl, "description", ""))

    @property
    def channels_last(self) -> bool:
        return bool(getattr(self.impl, "channels_last", False))

    @property
    def own_collate(self) -> bool:
        return getattr(self.impl, "collate", None) is not None

    def build_model(self, spec: WorkloadSpec) -> Any:
        return self.impl.build_model(spec)

    def open_dataset(self, root: Path, spec: WorkloadSpec) -> Any:
        return self.impl.open_dataset(Path(root), spec)

    def synthetic_batch(self, spec: WorkloadSpec, device: Any) -> tuple[Any, Any]:
        x, y = self.impl.synthetic_batch(spec, device)
        return x, y

    def loss(self, spec: WorkloadSpec) -> Callable[[Any, Any], Any]:
        fn: Callable[[Any, Any], Any] = self.impl.loss(spec)
        return fn

    def collate_fn(self) -> Callable[[Sequence[Any]], Any]:
        own: Callable[[Sequence[Any]], Any] | None = getattr(self.impl, "collate", None)
        if own is not None:
            return own
        from codl.harness import data

        return data.collate

    def generate_dataset(self, spec: DatasetSpec, out: Path) -> int:
        gen = getattr(self.impl, "generate_dataset", None)
        if gen is None:
            raise ConfigError([f"dataset.generator: workload {self.ref!r} has no generate_dataset"])
        return int(gen(spec, out))

    def ddp_options(self, spec: WorkloadSpec) -> dict[str, Any]:
        hints = getattr(self.impl, "ddp_options", None)
        return dict(hints(spec)) if hints is not None else {}

    def problems(self, spec: RunSpec) -> list[str]:
        own = getattr(self.impl, "problems", None)
        return [str(p) for p in own(spec)] if own is not None else []


_REGISTRY: dict[str, Loaded] = {}


def register(workload: Any) -> Loaded:
    """Add a workload under its name (the shipped ones; plugins use entry points instead)."""
    loaded = Loaded(str(workload.name), _checked(str(workload.name), workload))
    if loaded.ref in _REGISTRY:
        raise ValueError(f"workload {loaded.ref!r} registered twice")
    _REGISTRY[loaded.ref] = loaded
    return loaded


def names() -> list[str]:
    """The registered names."""
    return sorted(_REGISTRY)


def entry_point_names() -> list[str]:
    """The names installed packages give in the ``codl.workloads`` entry-point group."""
    return sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})


def get(ref: str) -> Loaded:
    """The workload ``ref`` names; one ConfigError line (``workload.model: ...``) if none."""
    return _resolve(ref)


def problem(ref: str, key: str = "workload.model") -> str | None:
    """The one-line problem with the reference ``ref``, or None when it names a workload."""
    try:
        _resolve(ref)
    except ConfigError as exc:
        return exc.problems[0].replace("workload.model:", f"{key}:", 1)
    return None


@functools.cache
def _resolve(ref: str) -> Loaded:
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    if ":" in ref or "." in ref:
        return Loaded(ref, _checked(ref, _from_reference(ref)))
    eps = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == ref]
    if eps:
        try:
            obj = eps[0].load()
        except Exception as exc:
            raise _error(
                ref,
                f"entry point {eps[0].value!r} of {ENTRY_POINT_GROUP!r} cannot be loaded "
                f"({_brief(exc)})",
            ) from None
        return Loaded(ref, _checked(ref, _made(ref, obj)))
    known = names() + entry_point_names()
    raise _error(
        ref,
        f"no such workload; expected a registered name or entry point ({', '.join(known)}) or "
        "'package.module:factory'",
    )


def _from_reference(ref: str) -> Any:
    if not _REFERENCE.match(ref):
        raise _error(ref, "expected 'package.module:factory' (dotted Python names)")
    module_name, _, attr = ref.partition(":")
    if not attr:
        raise _error(ref, "no ':factory' part; expected 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise _error(ref, f"module {module_name!r} cannot be imported ({_brief(exc)})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _error(ref, f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return _made(ref, obj)


def _made(ref: str, obj: Any) -> Any:
    """``obj`` itself when it is a workload, else what calling it (a factory) returns."""
    if _looks_like_workload(obj) or not callable(obj):
        return obj
    try:
        return obj()
    except Exception as exc:
        raise _error(ref, f"the factory raised {_brief(exc)}") from None


def _looks_like_workload(obj: Any) -> bool:
    return not isinstance(obj, type) and all(hasattr(obj, m) for m in ("name", *REQUIRED))


def _checked(ref: str, obj: Any) -> Any:
    """``obj`` if it has every member the protocol requires; else the line naming the first
    missing or wrong one."""
    if not any(hasattr(obj, m) for m in REQUIRED):
        raise _error(
            ref,
            f"got {type(obj).__name__} {_short(obj)}, expected a workload (an object with "
            f"name, dataset_kind, {', '.join(REQUIRED)}) or a factory returning one",
        )
    for member in REQUIRED:
        if not callable(getattr(obj, member, None)):
            raise _error(
                ref,
                f"{type(obj).__name__} has no method {member!r}; a workload needs "
                f"{', '.join(REQUIRED)}",
            )
    for member in OPTIONAL:
        value = getattr(obj, member, None)
        if value is not None and not callable(value):
            raise _error(ref, f"{type(obj).__name__}.{member} is not callable")
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise _error(ref, f"{type(obj).__name__}.name: got {name!r}, expected a non-empty string")
    kind = getattr(obj, "dataset_kind", None)
    kinds = [k.value for k in DatasetKind]
    if kind not in kinds:
        raise _error(
            ref, f"{type(obj).__name__}.dataset_kind: got {kind!r}, expected one of {kinds}"
        )
    if kind == DatasetKind.WORKLOAD and getattr(obj, "generate_dataset", None) is None:
        raise _error(
            ref, f"{type(obj).__name__} reads kind 'workload' but has no method 'generate_dataset'"
        )
    return obj


def plan_problems(spec: RunSpec) -> list[str]:
    """What the run's workload says against ``spec`` (``codl plan`` and the workflow): the
    reference, the data set it reads and builds, the hand-off, DDP options, its own checks."""
    line = problem(spec.workload.model)
    if line is not None:
        return [line]
    w = get(spec.workload.model)
    out: list[str] = []
    ds = spec.dataset
    if spec.mode.loads and ds.kind is not w.dataset_kind:
        out.append(
            f"dataset.kind: got {ds.kind.value!r}, but workload {spec.workload.model!r} reads "
            f"{w.dataset_kind.value!r} data sets"
        )
    if spec.mode.loads and ds.generator and ds.kind is not DatasetKind.WORKLOAD:
        out.append(
            f"dataset.generator: got {ds.generator!r} with dataset.kind {ds.kind.value!r}, "
            "expected it only with kind 'workload' (codl generates the other kinds)"
        )
    if spec.mode.loads and ds.kind is DatasetKind.WORKLOAD:
        gen = problem(ds.generator, "dataset.generator")
        if gen is not None:
            out.append(gen)
        elif (kind := get(ds.generator).dataset_kind) is not DatasetKind.WORKLOAD:
            out.append(
                f"dataset.generator: {ds.generator!r} reads {kind.value!r} data sets, which "
                "codl generates; expected a workload of kind 'workload'"
            )
    if spec.mode.loads and spec.loader.handoff is Handoff.RING and w.own_collate:
        out.append(
            f"loader.handoff: 'ring' stacks samples into its slots, but workload "
            f"{spec.workload.model!r} has its own collate; expected 'torch'"
        )
    try:
        bad = sorted(set(w.ddp_options(spec.workload)) - DDP_OPTIONS)
        own = w.problems(spec)
    except Exception as exc:
        return [*out, f"workload.model: {spec.workload.model!r}: checking it raised {_brief(exc)}"]
    if bad:
        out.append(
            f"workload.model: {spec.workload.model!r} asks DistributedDataParallel for {bad}, "
            f"expected only {sorted(DDP_OPTIONS)}"
        )
    return out + own


def _error(ref: str, what: str) -> ConfigError:
    return ConfigError([f"workload.model: got {ref!r}: {what}"])


def _brief(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 40 else text[:37] + "..."


# --- the shipped workloads --------------------------------------------------------------------


@dataclass(frozen=True)
class ImageClassifier:
    """A 2-D image classifier on a JPEG data set (the loader: ``codl.harness.data``)."""

    name: str
    description: str
    build: Callable[[WorkloadSpec], Any]
    dataset_kind: DatasetKind = DatasetKind.JPEG
    channels_last: bool = True

    def build_model(self, spec: WorkloadSpec) -> Any:
        return self.build(spec)

    def open_dataset(self, root: Path, spec: WorkloadSpec) -> Any:
        from codl.harness import data

        return data.ImageFolderFiles(root, spec.image_size, cost=data.dataset_cost(root))

    def synthetic_batch(self, spec: WorkloadSpec, device: Any) -> tuple[Any, Any]:
        import torch

        bs, s = spec.batch_size, spec.image_size
        x = torch.randn((bs, 3, s, s), device=device)
        return x, torch.randint(0, spec.classes, (bs,), device=device)

    def loss(self, spec: WorkloadSpec) -> Any:
        import torch

        return torch.nn.CrossEntropyLoss()


@dataclass(frozen=True)
class VolumeRegressor:
    """A 3-D CNN regressing 4 targets from 4-channel HDF5 cubes (CosmoFlow-like)."""

    name: str
    description: str
    build: Callable[[WorkloadSpec], Any]
    dataset_kind: DatasetKind = DatasetKind.VOLUME

    def build_model(self, spec: WorkloadSpec) -> Any:
        return self.build(spec)

    def open_dataset(self, root: Path, spec: WorkloadSpec) -> Any:
        from codl.harness import data

        return data.VolumeFiles(root, spec.image_size)

    def synthetic_batch(self, spec: WorkloadSpec, device: Any) -> tuple[Any, Any]:
        import torch

        bs, s = spec.batch_size, spec.image_size
        x = torch.randn((bs, 4, s, s, s), device=device)
        return x, torch.randn(bs, 4, device=device)

    def loss(self, spec: WorkloadSpec) -> Any:
        import torch

        return torch.nn.MSELoss()


@dataclass(frozen=True)
class LanguageModel:
    """A decoder-only transformer LM on a text data set (``codl.harness.text``): documents
    tokenized in the loader workers by the data set's BPE, packed into ``workload.seq_len``
    tokens; ``workload.classes`` is the vocabulary the model's head predicts."""

    name: str
    description: str
    layers: int
    heads: int
    width: int
    dataset_kind: DatasetKind = DatasetKind.TEXT

    def build_model(self, spec: WorkloadSpec) -> Any:
        from codl.harness import text

        return text.Gpt(
            text.GptShape(spec.classes, spec.seq_len, self.layers, self.heads, self.width)
        )

    def open_dataset(self, root: Path, spec: WorkloadSpec) -> Any:
        from codl.harness import text

        return text.PackedDocuments(root, spec.seq_len, vocab=spec.classes)

    def synthetic_batch(self, spec: WorkloadSpec, device: Any) -> tuple[Any, Any]:
        import torch

        shape = (spec.batch_size, spec.seq_len)
        x = torch.randint(0, spec.classes, shape, device=device)
        return x, torch.randint(0, spec.classes, shape, device=device)

    def loss(self, spec: WorkloadSpec) -> Any:
        from codl.harness import text

        return text.lm_loss

    def ddp_options(self, spec: WorkloadSpec) -> dict[str, Any]:
        # The gradients are the buckets' views: no copy of ~500 MB per step into the buckets
        # for GPT-2 small, as LM training scripts set it.
        return {"gradient_as_bucket_view": True}

    def problems(self, spec: RunSpec) -> list[str]:
        if self.width % self.heads:  # pragma: no cover - the shipped shapes divide
            return [f"workload.model: width {self.width} not divisible by {self.heads} heads"]
        if spec.workload.classes < 257:
            return [
                f"workload.classes: got {spec.workload.classes} with {self.name!r}, expected "
                ">= 257 (the vocabulary: 256 bytes and the end-of-text token at least)"
            ]
        return []


def _resnet(depth: str) -> Callable[[WorkloadSpec], Any]:
    def build(spec: WorkloadSpec) -> Any:
        import torchvision

        return getattr(torchvision.models, depth)(weights=None, num_classes=spec.classes)

    return build


def _resnet_tiny(spec: WorkloadSpec) -> Any:
    # torchvision's own ResNet with one BasicBlock per stage: the real architecture and kernels,
    # ~4.9 M parameters, fast enough for 2-core CI runs.
    from torchvision.models.resnet import BasicBlock, ResNet

    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=spec.classes)


def _cosmoflow(spec: WorkloadSpec) -> Any:
    import torch
    from torch import nn

    # CosmoFlow-like 3D CNN (conv-pool stages then dense layers), regressing 4 targets from a
    # 4-channel cube. Channels doubled per stage as in the MLPerf HPC reference.
    layers: list[nn.Module] = []
    ch_in = 4
    for i in range(4):
        ch_out = 16 * 2**i
        layers += [
            nn.Conv3d(ch_in, ch_out, 3, padding=1),
            nn.LeakyReLU(0.3),
            nn.MaxPool3d(2),
        ]
        ch_in = ch_out
    head = nn.Linear(128, 4)
    # Zero bias: the tanh head starts centred on the targets' mean (zero).
    torch.nn.init.zeros_(head.bias)
    layers += [
        nn.AdaptiveAvgPool3d(2),
        nn.Flatten(),
        nn.Linear(ch_in * 8, 128),
        nn.LeakyReLU(0.3),
        head,
        nn.Tanh(),
    ]
    return nn.Sequential(*layers)


register(ImageClassifier("resnet50", "torchvision ResNet-50", _resnet("resnet50")))
register(ImageClassifier("resnet18", "torchvision ResNet-18", _resnet("resnet18")))
register(ImageClassifier("resnet_tiny", "torchvision ResNet, 1 block/stage", _resnet_tiny))
register(VolumeRegressor("cosmoflow", "CosmoFlow-like 3D CNN", _cosmoflow))
register(LanguageModel("gpt2_small", "decoder-only LM, GPT-2 small shape (124 M)", 12, 12, 768))
register(LanguageModel("gpt_tiny", "decoder-only LM, 2 layers of width 64 (CPU tests)", 2, 2, 64))
