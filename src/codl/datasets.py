"""Synthetic input data sets, generated deterministically from a DatasetSpec.

JPEG: an ImageFolder (``class_NNN/img_NNNNNN.jpg``) of smooth random images with per-image size
jitter, so that decode cost and file sizes resemble natural photos rather than incompressible
noise (noise JPEGs are ~3x larger and slower to decode than ImageNet's at the same resolution).
A JPEG set of ``cost: light`` stores the same images pre-decoded, as uint8 CHW ``.npy`` arrays
(``class_NNN/img_NNNNNN.npy``): the cheap end of the loader-cost axis, no decode per sample.
Volume: HDF5 sample files of float32 4-channel cubes, CosmoFlow-like.
Text: ``samples`` documents of varied length (log-normal, median ~250 words) drawn from a Zipfian
lexicon of made-up words, in sentences and paragraphs, back to back in one UTF-8 file with their
byte offsets, and a byte-level BPE of ``classes`` tokens trained on them with ``tokenizers``
(codl.harness.text reads them).
Workload: the files a workload's own ``generate_dataset`` writes (``dataset.generator``).
A MANIFEST.json written last records the spec, file count and bytes; its presence marks a
complete data set.

Ownership: every directory built here carries ``.codl-dataset`` from its first moment, and an
existing directory is replaced only if it carries that marker (or a codl MANIFEST, written by
versions before the marker), or is empty. ``--out`` and ``--to`` are user input: a typo must not
delete a directory codl did not create.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from codl.errors import CodlError
from codl.paths import DATASET_MANIFEST
from codl.spec import DatasetCost, DatasetKind, DatasetSpec, to_dict

MANIFEST = DATASET_MANIFEST
OWNER_MARKER = ".codl-dataset"
VOLUME_CHANNELS = 4
# Data set keys newer than the first manifests, with the value those manifests' sets have.
_ADDED_KEY_DEFAULTS: dict[str, Any] = {"cost": DatasetCost.STANDARD.value, "generator": ""}
# A MANIFEST larger than this is not one of ours (ours are a few hundred bytes).
_MAX_MANIFEST_BYTES = 1 << 20


def _absolute(path: Path, what: str) -> Path:
    # abspath, not resolve(): a symlink given as the target must stay visible as a symlink.
    out = Path(os.path.abspath(path))
    if not out.name:
        raise CodlError(f"{what} {path}: the file system root cannot be a data set directory")
    return out


def _is_codl_manifest(directory: Path) -> bool:
    m = directory / MANIFEST
    try:
        if m.is_symlink() or not m.is_file() or m.stat().st_size > _MAX_MANIFEST_BYTES:
            return False
        data = json.loads(m.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and {"spec", "files", "bytes"} <= data.keys()


def owned_by_codl(directory: Path) -> bool:
    """True if ``directory`` is a data set directory codl built (marker or codl MANIFEST)."""
    marker = directory / OWNER_MARKER
    return (marker.is_file() and not marker.is_symlink()) or _is_codl_manifest(directory)


def check_replaceable(target: Path, what: str) -> None:
    """Raise unless ``target`` is absent, empty, or a directory codl marked as its own."""
    if target.is_symlink():
        raise CodlError(f"{what} {target} is a symbolic link; refusing to replace it")
    if not target.exists():
        return
    if not target.is_dir():
        raise CodlError(f"{what} {target} exists and is not a directory; refusing to replace it")
    if owned_by_codl(target):
        return
    try:
        empty = next(target.iterdir(), None) is None
    except OSError as e:
        raise CodlError(f"{what} {target} cannot be listed ({e.strerror or e})") from e
    if not empty:
        raise CodlError(
            f"{what} {target} exists and was not created by codl (no {OWNER_MARKER} marker, "
            f"no codl {MANIFEST}); refusing to delete it. Remove it yourself or choose another "
            "directory"
        )


@contextlib.contextmanager
def _building(target: Path, what: str) -> Iterator[Path]:
    """A fresh, marked, uniquely named sibling of ``target`` to build in; moved into place at
    the end, replacing ``target`` only if ``check_replaceable`` allows it."""
    check_replaceable(target, what)
    target.parent.mkdir(parents=True, exist_ok=True)
    # A unique name per writer: two builds of one data set never share (or delete) a partial.
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        (tmp / OWNER_MARKER).write_text(json.dumps({"created_by": "codl", "pid": os.getpid()}))
        yield tmp
        _replace_dir(tmp, target, what)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(new: Path, target: Path, what: str) -> None:
    # Checked again: the target may have appeared while the data set was being built.
    check_replaceable(target, what)
    if not target.exists():
        os.replace(new, target)
        return
    if not any(target.iterdir()):
        target.rmdir()
        os.replace(new, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    os.replace(target, old / target.name)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)


def generate(spec: DatasetSpec, out_dir: Path) -> dict[str, Any]:
    """Build the data set in a sibling temporary directory, then move it into place."""
    out_dir = _absolute(Path(out_dir), "--out")
    with _building(out_dir, "--out") as tmp:
        rng = np.random.default_rng(spec.seed)
        extra: dict[str, Any] = {}
        # DatasetKind(...): callers building a DatasetSpec by hand may pass the kind's value.
        kind = DatasetKind(spec.kind)
        if kind is DatasetKind.JPEG:
            files, nbytes = _generate_jpeg(spec, tmp, rng)
        elif kind is DatasetKind.VOLUME:
            files, nbytes = _generate_volumes(spec, tmp, rng)
        elif kind is DatasetKind.TEXT:
            files, nbytes, extra["text"] = _generate_text(spec, tmp, rng)
        else:
            files, nbytes = _generate_by_workload(spec, tmp)
        manifest = {
            "spec": to_dict(spec),
            "files": files,
            "bytes": nbytes,
            **extra,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def _photo_like(spec: DatasetSpec, rng: np.random.Generator) -> np.ndarray:
    """One HWC uint8 image: a low-frequency colour field plus mild noise, compresses like a
    photo."""
    from PIL import Image

    h = max(8, int(spec.height * rng.uniform(0.8, 1.2)))
    w = max(8, int(spec.width * rng.uniform(0.8, 1.2)))
    coarse = rng.integers(0, 256, size=(max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    img = Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC)
    arr = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, size=(h, w, 3))
    pixels: np.ndarray = np.clip(arr, 0, 255).astype(np.uint8)
    return pixels


def _generate_jpeg(spec: DatasetSpec, root: Path, rng: np.random.Generator) -> tuple[int, int]:
    from PIL import Image

    pre_decoded = spec.cost is DatasetCost.LIGHT
    nbytes = 0
    for i in range(spec.samples):
        label = i % spec.classes
        pixels = _photo_like(spec, rng)
        d = root / f"class_{label:03d}"
        d.mkdir(exist_ok=True)
        if pre_decoded:
            # CHW and contiguous: the loader turns the file into a tensor without a copy.
            path = d / f"img_{i:06d}.npy"
            np.save(path, np.ascontiguousarray(pixels.transpose(2, 0, 1)))
        else:
            path = d / f"img_{i:06d}.jpg"
            Image.fromarray(pixels).save(path, format="JPEG", quality=spec.quality)
        nbytes += path.stat().st_size
    return spec.samples, nbytes


def _generate_volumes(spec: DatasetSpec, root: Path, rng: np.random.Generator) -> tuple[int, int]:
    import h5py

    nbytes = 0
    shape = (VOLUME_CHANNELS, spec.depth, spec.height, spec.width)
    for i in range(spec.samples):
        path = root / f"sample_{i:06d}.h5"
        vol = rng.standard_normal(shape, dtype=np.float32)
        target = rng.standard_normal(VOLUME_CHANNELS, dtype=np.float32)
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=vol)
            f.create_dataset("y", data=target)
            f.attrs["label"] = i % spec.classes
        nbytes += path.stat().st_size
    return spec.samples, nbytes


# Documents: log-normal word counts (median ~250, a few of several thousand), clipped.
_DOC_WORDS_MEDIAN = 250
_DOC_WORDS_SIGMA = 1.0
_DOC_WORDS_RANGE = (8, 6000)
_LEXICON = 40_000
_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "qu", "st", "er"]


def _lexicon(rng: np.random.Generator) -> np.ndarray:
    """Made-up words of 1-4 syllables, ranked: word r is drawn with weight 1 / (r + 1)^1.1."""
    lengths = rng.choice([1, 2, 3, 4], size=_LEXICON, p=[0.2, 0.4, 0.3, 0.1])
    picks = rng.integers(0, len(_SYLLABLES), size=(_LEXICON, 4))
    return np.array(
        ["".join(_SYLLABLES[j] for j in p[:n]) for p, n in zip(picks, lengths, strict=True)]
    )


def _document(rng: np.random.Generator, lexicon: np.ndarray, cdf: np.ndarray) -> str:
    words = int(
        np.clip(rng.lognormal(np.log(_DOC_WORDS_MEDIAN), _DOC_WORDS_SIGMA), *_DOC_WORDS_RANGE)
    )
    picked = lexicon[np.searchsorted(cdf, rng.random(words))]
    # Sentences of 4-24 words, paragraphs of 2-8 sentences, some numbers: what BPE meets in text.
    out: list[str] = []
    i = 0
    sentences = 0
    while i < words:
        n = int(rng.integers(4, 25))
        sentence = [str(w) for w in picked[i : i + n]]
        if rng.random() < 0.2:
            sentence.insert(int(rng.integers(0, len(sentence) + 1)), str(rng.integers(0, 10_000)))
        sentence[0] = sentence[0].capitalize()
        out.append(" ".join(sentence) + ("." if rng.random() < 0.85 else "?"))
        sentences += 1
        i += n
        if sentences % int(rng.integers(2, 9)) == 0:
            out.append("\n\n")
    return " ".join(out).replace(" \n\n ", "\n\n").strip() + "\n"


def _generate_text(
    spec: DatasetSpec, root: Path, rng: np.random.Generator
) -> tuple[int, int, dict[str, Any]]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from codl.harness.text import DOCUMENTS, END_OF_TEXT, OFFSETS, TOKENIZER

    lexicon = _lexicon(rng)
    weights = 1.0 / np.arange(1, _LEXICON + 1) ** 1.1
    cdf = np.cumsum(weights / weights.sum())
    offsets = [0]
    with open(root / DOCUMENTS, "wb") as f:
        for _ in range(spec.samples):
            raw = _document(rng, lexicon, cdf).encode("utf-8")
            f.write(raw)
            offsets.append(offsets[-1] + len(raw))
    np.save(root / OFFSETS, np.array(offsets, dtype=np.int64))
    # GPT-2's kind of BPE: byte-level (every byte a token, nothing unknown), trained here on
    # this corpus to ``classes`` tokens; the end-of-text token separates packed documents.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.classes,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = (root / DOCUMENTS).read_bytes()
    docs = [text[a:b].decode("utf-8") for a, b in itertools.pairwise(offsets)]
    tok.train_from_iterator(docs, trainer=trainer)
    tok.save(str(root / TOKENIZER))
    tokens = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
    nbytes = sum(p.stat().st_size for p in root.iterdir() if p.is_file())
    stats = {
        "documents": spec.samples,
        "tokens": tokens,
        "vocab": tok.get_vocab_size(),
        "bytes_per_token": round(len(text) / max(tokens, 1), 4),
    }
    return spec.samples, nbytes, stats


def _generate_by_workload(spec: DatasetSpec, root: Path) -> tuple[int, int]:
    """The files of a workload's own generator (kind ``workload``); its own errors pass
    through, named."""
    from codl.harness import workloads

    w = workloads.get(spec.generator)
    try:
        samples = w.generate_dataset(spec, root)
    except CodlError:
        raise
    except Exception as exc:
        raise CodlError(
            f"dataset.generator {spec.generator!r}: generate_dataset raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    nbytes = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    return samples, nbytes


def read_manifest(out_dir: Path) -> dict[str, Any]:
    """The MANIFEST of a complete data set; CodlError naming the file if it is not one."""
    path = Path(out_dir) / MANIFEST
    try:
        if path.stat().st_size > _MAX_MANIFEST_BYTES:
            raise CodlError(f"{path}: {path.stat().st_size} bytes, not a codl data set manifest")
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CodlError(
            f"{path}: no such file; {out_dir} is not a complete codl data set"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CodlError(f"{path}: unreadable data set manifest ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
        raise CodlError(f"{path}: not a codl data set manifest (no `spec` mapping)")
    return data


def check_dataset(spec: DatasetSpec, directory: Path) -> dict[str, Any]:
    """The manifest of ``directory`` if it holds the data set ``spec`` describes; else a
    CodlError naming the directory and every differing key (the tier is where a copy lives, not
    what it holds, and is not compared)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CodlError(f"--dataset-dir {directory}: no such directory")
    manifest = read_manifest(directory)
    stored = manifest["spec"]
    expected = {k: v for k, v in to_dict(spec).items() if k != "tier"}
    # Keys added after the first data sets were built are absent from their manifests, which
    # then hold the key's default.
    stored = {**_ADDED_KEY_DEFAULTS, **stored}
    diff = [
        f"{k}: data set has {stored.get(k, '<missing>')!r}, spec wants {v!r}"
        for k, v in expected.items()
        if stored.get(k) != v
    ]
    if diff:
        raise CodlError(
            f"--dataset-dir {directory} holds another data set than the spec's dataset "
            f"({'; '.join(diff)}); the run would be labelled with the wrong data set"
        )
    return manifest


def stage(source: Path, target: Path, *, marker: Path) -> dict[str, Any]:
    """Copy a complete data set to a storage tier (temporary name, then rename), then mark it."""
    source = _absolute(Path(source), "source")
    target = _absolute(Path(target), "--to")
    if not _is_codl_manifest(source):
        raise CodlError(f"{source / MANIFEST}: missing or not a codl data set manifest")
    manifest = read_manifest(source)
    real_source, real_target = Path(os.path.realpath(source)), Path(os.path.realpath(target))
    if (
        real_source == real_target
        or real_source in real_target.parents
        or real_target in real_source.parents
    ):
        raise CodlError(
            f"--to {target} and the data set {source} overlap; staging would replace its own source"
        )
    with _building(target, "--to") as tmp:
        # dirs_exist_ok: tmp exists already (it carries the ownership marker).
        shutil.copytree(source, tmp, dirs_exist_ok=True, symlinks=True)
        (tmp / OWNER_MARKER).write_text(
            json.dumps({"created_by": "codl", "staged_from": str(source)})
        )
    marker = Path(marker)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"source": str(source), "target": str(target), **manifest}))
    return manifest
